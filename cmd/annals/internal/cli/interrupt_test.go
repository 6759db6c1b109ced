package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
)

// lineCanceller collects what is written to it and cancels once a line
// holding mark has been written: a command line interrupted (as by Ctrl-C)
// right after its first step's progress.
type lineCanceller struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	mark   string
	cancel context.CancelFunc
}

func (w *lineCanceller) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.mark) {
		w.cancel()
	}
	return n, err
}

func (w *lineCanceller) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// annalsInterrupted runs the command line against url and cancels its
// context (the binary's SIGINT and SIGTERM) once its stderr holds mark; it
// fails the test if the command does not return within a minute.
func annalsInterrupted(t *testing.T, url, mark string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	errOut := &lineCanceller{mark: mark, cancel: cancel}
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, strings.NewReader(""), &out, errOut, getenv) }()
	select {
	case code := <-done:
		return result{code, out.String(), errOut.String()}
	case <-time.After(time.Minute):
		t.Fatalf("%v did not return a minute after it started (stderr so far: %q)", args, errOut.String())
		return result{}
	}
}

// archive and scavenge with --output json print their progress on stderr
// (stdout holds the final state alone), and a run interrupted after its
// first step exits 1, says how far it got, and still prints its state
// (done false) as JSON; the next run continues it.
func TestArchiveAndScavengeInterruptedWithJSON(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for range 10 {
		if r := annals(t, db.URL, "append", "order-1", "order.placed", `{"total": 1}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	// Every event but the newest two of order-1 expires at the next scavenge.
	if r := annals(t, db.URL, "stream", "set", "order-1", "--max-count", "2"); r.code != 0 {
		t.Fatalf("stream set: %+v", r)
	}

	type state struct {
		RunID      int64 `json:"run_id"`
		ArchivedTo int64 `json:"archived_to"`
		ScannedTo  int64 `json:"scanned_to"`
		Moved      int64 `json:"moved"`
		Done       bool  `json:"done"`
	}
	for _, c := range []struct {
		name     string
		args     []string
		progress string
		next     string
		reached  func(s state) int64
	}{
		{"archive", []string{"archive", "--before", "9", "--batch", "2", "--pause", "1h", "--output", "json"},
			"positions 1..2 of 8 archived", "the next 'annals archive' continues it", func(s state) int64 { return s.ArchivedTo }},
		{"scavenge", []string{"scavenge", "--batch", "2", "--pause", "1h", "--output", "json"},
			"run 1: positions 1..2 of", "the next 'annals scavenge' continues it", func(s state) int64 { return s.ScannedTo }},
	} {
		r := annalsInterrupted(t, db.URL, c.progress, c.args...)
		var s state
		if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
			t.Fatalf("%s interrupted: stdout is not one JSON object (%v): %+v", c.name, err, r)
		}
		if r.code != ExitFailure || s.RunID == 0 || s.Done || c.reached(s) != 2 ||
			!strings.Contains(r.stderr, c.progress) || !strings.Contains(r.stderr, "interrupted: run ") || !strings.Contains(r.stderr, c.next) {
			t.Fatalf("%s interrupted after its first step: %+v, state %+v", c.name, r, s)
		}
		// The next run continues the same run to its end.
		r = annals(t, db.URL, append(c.args[:len(c.args)-4:len(c.args)-4], "--output", "json")...)
		var end state
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &end) != nil || !end.Done || end.RunID != s.RunID {
			t.Fatalf("%s after the interruption: %+v", c.name, r)
		}
	}
}
