package cli

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
)

// syncBuffer is a bytes.Buffer safe to read while the CLI writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startTail runs `annals tail ARGS` in the background until the test ends.
func startTail(t *testing.T, url string, args ...string) (*syncBuffer, func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := &syncBuffer{}, &syncBuffer{}
	done := make(chan int, 1)
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
	go func() {
		done <- run(ctx, append([]string{"tail"}, args...), strings.NewReader(""), out, errOut, getenv)
	}()
	stopped := false
	var code int
	stop := func() int {
		if !stopped {
			cancel()
			code = <-done
			stopped = true
		}
		return code
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("tail stderr: %s", errOut.String())
		}
	})
	return out, stop
}

func TestTail(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	appendEv := func(stream, typ string) {
		t.Helper()
		if r := annals(t, db.URL, "append", stream, typ, `{"n":1}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	appendEv("order-1", "order.placed")
	appendEv("order-1", "order.shipped")
	appendEv("pay-1", "payment.received")

	t.Run("ToHeadAndExit", func(t *testing.T) {
		r := annals(t, db.URL, "tail", "--output", "jsonl", "--from", "2")
		if r.code != 0 || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, `"global_sequence":2`) {
			t.Fatalf("tail --from 2: %+v", r)
		}
		r = annals(t, db.URL, "tail", "--types", "order.*")
		if r.code != 0 || strings.Count(r.stdout, "\n") != 3 || strings.Contains(r.stdout, "payment") {
			t.Fatalf("tail --types order.*: %+v", r)
		}
	})

	t.Run("FollowSeesNewEventsAtOnce", func(t *testing.T) {
		out, stop := startTail(t, db.URL, "--follow", "--output", "jsonl", "--types", "*.shipped")
		annalstest.WaitFor(t, 10*time.Second, func() bool { return strings.Count(out.String(), "\n") == 1 })
		appendEv("order-2", "order.shipped")
		appendEv("order-2", "order.cancelled")
		annalstest.WaitFor(t, 10*time.Second, func() bool { return strings.Count(out.String(), "\n") == 2 })
		if code := stop(); code != 0 {
			t.Fatalf("tail --follow exited %d", code)
		}
		if strings.Contains(out.String(), "cancelled") {
			t.Fatalf("filter leaked: %s", out.String())
		}
	})

	t.Run("SubscriberSharesOnePosition", func(t *testing.T) {
		// A named tail is an observer: the second run resumes after the first.
		r := annals(t, db.URL, "tail", "--subscriber", "audit", "--output", "jsonl")
		if r.code != 0 || strings.Count(r.stdout, "\n") < 3 {
			t.Fatalf("first named tail: %+v", r)
		}
		appendEv("order-3", "order.placed")
		r = annals(t, db.URL, "tail", "--subscriber", "audit", "--output", "jsonl")
		if r.code != 0 || strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, "order-3") {
			t.Fatalf("second named tail should print only the new event: %+v", r)
		}
		// Two followers with one name: one leads, the other stands by.
		a, stopA := startTail(t, db.URL, "--follow", "--subscriber", "shared", "--output", "jsonl")
		annalstest.WaitFor(t, 10*time.Second, func() bool { return strings.Count(a.String(), "\n") >= 6 })
		b, stopB := startTail(t, db.URL, "--follow", "--subscriber", "shared", "--output", "jsonl")
		appendEv("order-4", "order.placed")
		annalstest.WaitFor(t, 10*time.Second, func() bool { return strings.Contains(a.String()+b.String(), "order-4") })
		stopA()
		stopB()
		if n := strings.Count(a.String()+b.String(), `"order-4"`); n != 1 {
			t.Fatalf("order-4 printed %d times by two tails sharing a subscriber", n)
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		for _, args := range [][]string{
			{"tail", "--output", "xml"},
			{"tail", "--from", "-2"},
			{"tail", "--types", "ord*"},
			{"tail", "--types", "a..b"},
			{"tail", "--subscriber", "x", "--from", "3"},
			{"tail", "--subscriber", ""},
			{"tail", "extra"},
		} {
			if r := annals(t, db.URL, args...); r.code != 2 {
				t.Errorf("annals %s: code %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
			}
		}
	})
}
