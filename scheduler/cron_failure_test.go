package scheduler

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// lines returns the logged lines that contain substr.
func (b *syncBuffer) lines(substr string) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// The dispatcher's failure logs carry the error's message on one line
// (telemetry.Err), not the error chain with its stack traces.
func TestFailureLogsAreOneLine(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	var logs syncBuffer
	s := newScheduler(t, db, &Config{Clock: clock, MaxAttempts: 2, RetryBackoff: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := t.Context()
	// A timer whose append fails (a wrong expected version): retried, then
	// kept as failed.
	if _, err := s.ScheduleTimer(ctx, nil, Timer{At: t0, StreamID: "x", Expected: eventstore.Exact(5),
		Events: []eventstore.EventData{ev("x", map[string]int{})}}); err != nil {
		t.Fatal(err)
	}
	// A task whose Event fails, and one whose stored spec no longer parses.
	if err := s.AddTask(ctx, Task{Name: "failing", Spec: "* * * * * *", StreamID: "f",
		Event: func(time.Time) (eventstore.EventData, error) {
			return eventstore.EventData{}, errors.New("report service down")
		}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTask(ctx, Task{Name: "garbled", Spec: "* * * * * *", StreamID: "g"}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE annals.cron_tasks SET spec = 'not a spec' WHERE name = 'garbled'`); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	fireDue(t, s)
	clock.Advance(time.Second)
	fireDue(t, s)
	for _, msg := range []string{"timer failed; retrying later", "timer failed; it is kept", "cron tick failed", "does not parse"} {
		lines := logs.lines(msg)
		if len(lines) == 0 {
			t.Errorf("nothing logged with %q:\n%s", msg, logs.String())
			continue
		}
		for _, l := range lines {
			if strings.Contains(l, "stack trace") || strings.Contains(l, `\n`) || len(l) > 600 {
				t.Errorf("%q logged %d bytes over more than one line:\n%s", msg, len(l), l)
			}
		}
	}
}
