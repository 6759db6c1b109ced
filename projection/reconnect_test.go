package projection_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// countingHandler counts the log records whose message is msg.
type countingHandler struct {
	msg string
	n   *atomic.Int64
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestResumeAfterOutage: PostgreSQL is down long enough for the runner's
// reconnect backoff to grow (six failed attempts to take the lock: with an
// uncapped doubling from 500 ms the next pause would be 8 to 24 s), then
// comes back. The next event must be handled within 2 s of the server
// accepting connections, with a 30 s poll interval so that neither the
// lock's retry nor the listener's reconnect can hide behind polling.
func TestResumeAfterOutage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cluster, h := clusterOfItsOwn(ctx, t)

	probe := uuid.New()
	var handledAt atomic.Int64 // unix nanoseconds
	p := &seenProjection{name: "seen", before: func(_ context.Context, e eventstore.Event) error {
		if e.ID == probe {
			handledAt.CompareAndSwap(0, time.Now().UnixNano())
		}
		return nil
	}}
	var failures atomic.Int64
	cfg := testConfig(30 * time.Second)
	cfg.RetryBackoff = 500 * time.Millisecond // the default, as in production
	cfg.Logger = slog.New(countingHandler{msg: "annals: cannot take the subscription lock", n: &failures})
	r := h.newRunner(cfg, nil, p)
	h.appendEvents(3, 1)
	stop := h.run(r)
	h.waitCaughtUp(10*time.Second, "seen")

	down := time.Now()
	if err := cluster.Down(ctx); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 40*time.Second, func() bool { return failures.Load() >= 6 })
	if err := cluster.Up(ctx); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	t.Logf("down for %v, %d failed attempts to take the lock", up.Sub(down).Round(time.Millisecond), failures.Load())

	// Writes resume at once (an append on a connection the restart killed
	// fails; the retry, with the same event ID, gets a new one).
	for {
		_, err := h.store.Append(ctx, "acct-0", eventstore.Any, eventstore.EventData{ID: probe, Type: "acct.moved", Data: map[string]int{"n": -1}})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // back off before retrying, not a wait for a condition
	}
	appended := time.Since(up)
	annalstest.WaitFor(t, 30*time.Second, func() bool { return handledAt.Load() != 0 })
	resumed := time.Unix(0, handledAt.Load()).Sub(up)
	t.Logf("the probe was appended %v and handled %v after the server accepted connections", appended.Round(time.Millisecond), resumed.Round(time.Millisecond))
	// By design the runner tries the lock at most 1.5 s apart (1 s cap, ±50%
	// jitter) and the listener reconnects at most 1 s apart; a connect, a
	// claim and a read take milliseconds. The 2 s goal gets a 300 ms
	// tolerance for two cores shared with other tests; Up returns within
	// 100 ms after the server accepts connections, which only shortens the
	// measured time.
	if limit := 2*time.Second + 300*time.Millisecond; resumed > limit {
		t.Fatalf("the projection resumed %v after the server accepted connections; want at most %v", resumed, limit)
	}
	stop()
	h.checkSeenIsLog("seen")
	p.checkNoDupes(t)
}
