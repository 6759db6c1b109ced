package annalstest

import (
	"bytes"
	"sync"
)

// LogBuffer is a bytes.Buffer safe for concurrent use: a log destination
// (slog.NewTextHandler(&buf, nil)) that runners write to while the test
// reads it. The zero value is ready.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
