package natsconsumer_test

// A consumer losing the outcome of what it did for an event: the
// acknowledgement that fails after the event was handled (the NATS
// connection closed under it), and RunProjection's COMMIT that lands while
// its answer is lost (the PostgreSQL connection cut right after it was
// sent). Neither is the handler's failure: the event is not handled again,
// and the consumer goes on.

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// hookedTally is tally, calling hook (when set) each time it gets the
// event at position at, before it counts it; calls counts those times.
type hookedTally struct {
	at    int64
	hook  func(ctx context.Context, tx pgx.Tx) error
	calls *atomic.Int64
}

func (hookedTally) Name() string { return "tally" }

func (h hookedTally) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if e.GlobalSequence == h.at {
		h.calls.Add(1)
		if h.hook != nil {
			if err := h.hook(ctx, tx); err != nil {
				return err
			}
		}
	}
	return tally{}.Handle(ctx, tx, e)
}

// connect makes a NATS connection of the test's own, to close under a
// consumer.
func (e *env) connect(t *testing.T) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(e.ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// waitForLog waits (up to 10 s) for the log to say s.
func waitForLog(t *testing.T, logs *annalstest.LogBuffer, s string) {
	t.Helper()
	annalstest.WaitForErr(t, 10*time.Second, func() error {
		if out := logs.String(); !strings.Contains(out, s) {
			return errors.Newf("the log does not say %q; it ends:\n%s", s, out[max(0, len(out)-2000):])
		}
		return nil
	})
}

// checkAckWarning requires the log to have WARNed that acknowledging a
// handled event failed, saying what becomes of it, and to have no
// "moved under us" error.
func checkAckWarning(t *testing.T, logs *annalstest.LogBuffer) {
	t.Helper()
	out := logs.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "acknowledging a relayed event failed after it was handled") ||
		!strings.Contains(out, "AckWait") || !strings.Contains(out, "stream_seq=4") || strings.Contains(out, "moved under us") {
		t.Fatalf("the log does not WARN of the failed acknowledgement of stream message 4 (saying AckWait), or has a 'moved under us':\n%s", out)
	}
}

// TestRunAckFailureIsNotAHandlerFailure: the acknowledgement of an event
// Run handled fails (its NATS connection closed under it, by the handler
// here, so that Ack returns nats.ErrConnectionClosed). The event is not
// handed to the handler again: the failure is logged at WARN and Run goes
// on (its next fetch fails on the closed connection). Before, the failed
// acknowledgement was taken for the handler's failure, and the handler was
// called again every RetryBackoff, for ever.
func TestRunAckFailureIsNotAHandlerFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 10)
	nc := e.connect(t)
	var logs annalstest.LogBuffer
	c, err := natsconsumer.New(ctx, nc, &natsconsumer.Config{Durable: "run", Batch: 4, RetryBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		handled []int64
	)
	stop := start(ctx, func(ctx context.Context) error {
		return c.Run(ctx, func(_ context.Context, ev eventstore.Event) error {
			mu.Lock()
			defer mu.Unlock()
			handled = append(handled, ev.GlobalSequence)
			if ev.GlobalSequence == 4 {
				nc.Close()
			}
			return nil
		})
	})
	// Gone on to its next fetch (which fails on the closed connection).
	waitForLog(t, &logs, "fetching relayed events failed")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(handled) != 4 || handled[3] != 4 {
		t.Fatalf("Run handled %v; want 1..4, event 4 once", handled)
	}
	checkAckWarning(t, &logs)
}

// TestRunProjectionAckFailureAfterTheCommit: the acknowledgement of an
// event whose transaction RunProjection committed fails (the NATS
// connection closed under it). The event stays applied once, with the
// checkpoint at it, and RunProjection goes on. The next RunProjection
// (another connection) applies the events after it, and when the server
// delivers the unacknowledged event again (after AckWait) acknowledges it
// without applying it again. Before, the failed acknowledgement was taken
// for the handler's failure: the projection ran again in a new
// transaction, whose checkpoint save changed nothing (the checkpoint was
// there already), so it failed with "moved under us" and was rolled back,
// every RetryBackoff, for ever.
func TestRunProjectionAckFailureAfterTheCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 10)
	var logs annalstest.LogBuffer
	var calls atomic.Int64
	cfg := &natsconsumer.Config{Durable: "tally", Batch: 4, AckWait: 2 * time.Second, RetryBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	nc := e.connect(t)
	c, err := natsconsumer.New(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := hookedTally{at: 4, calls: &calls, hook: func(context.Context, pgx.Tx) error {
		if calls.Load() == 1 {
			nc.Close() // the commit comes next, then the acknowledgement
		}
		return nil
	}}
	stop := start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, p) })
	waitForLog(t, &logs, "fetching relayed events failed")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := e.tallied(ctx); got != once(4) || calls.Load() != 1 {
		t.Fatalf("tally %s, event 4 handled %d times; want %s, once", got, calls.Load(), once(4))
	}
	checkAckWarning(t, &logs)

	// The next RunProjection applies 5..10; message 4, delivered to the
	// closed connection and never acknowledged, comes again after AckWait
	// and is acknowledged without being applied.
	c, err = natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop = start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, p) })
	defer func() {
		if stop != nil {
			_ = stop()
		}
	}()
	annalstest.WaitFor(t, 10*time.Second, func() bool { return e.tallied(ctx) == once(10) })
	cons, err := e.js.Consumer(ctx, "ANNALS", "tally")
	if err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Stream == 10 && info.NumAckPending == 0
	})
	err = stop()
	stop = nil
	if err != nil {
		t.Fatal(err)
	}
	if got := e.tallied(ctx); got != once(10) || calls.Load() != 1 {
		t.Fatalf("tally %s, event 4 handled %d times; want %s, once", got, calls.Load(), once(10))
	}
}

// TestRunProjectionCommitAnswerLost: the connection of RunProjection's
// transaction for event 4 is cut right after its COMMIT was sent: the
// transaction commits (event 4 applied, checkpoint at it) but RunProjection
// gets an error instead of the answer, and tries the event again. The
// retry finds the checkpoint at the event already: it rolls its own
// transaction back (the projection's second pass discarded), acknowledges
// the message and goes on, every event applied once. Before, the retry's
// checkpoint save changed nothing, failed with "moved under us" and was
// rolled back, every RetryBackoff, for ever: the consumer was stuck at
// event 4.
func TestRunProjectionCommitAnswerLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 10)
	pool := annalstest.NewCutPool(t, e.dst)
	var logs annalstest.LogBuffer
	var calls atomic.Int64
	var cut *annalstest.CutConn
	p := hookedTally{at: 4, calls: &calls, hook: func(ctx context.Context, tx pgx.Tx) error {
		if calls.Load() != 1 {
			return nil
		}
		c, err := pool.Of(ctx, tx)
		if err != nil {
			return err
		}
		cut = c
		c.CutAfter(annalstest.HasCommit)
		return nil
	}}
	c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "tally", Batch: 4, RetryBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, pool.Pool, p) })
	defer func() {
		if stop != nil {
			_ = stop()
		}
	}()
	annalstest.WaitForErr(t, 10*time.Second, func() error {
		if got := e.tallied(ctx); got != once(10) {
			out := logs.String()
			return errors.Newf("tally %s; the log ends:\n%s", got, out[max(0, len(out)-1000):])
		}
		return nil
	})
	err = stop()
	stop = nil
	if err != nil {
		t.Fatal(err)
	}
	if cut == nil || !cut.Cut() {
		t.Fatal("the connection of event 4's transaction was not cut after its COMMIT")
	}
	var seq, pos int64
	if err := e.dst.Pool.QueryRow(ctx, `SELECT stream_seq, position FROM annals.relay_checkpoints WHERE consumer = 'tally'`).Scan(&seq, &pos); err != nil {
		t.Fatal(err)
	}
	if got := e.tallied(ctx); got != once(10) || calls.Load() != 2 || seq != 10 || pos != 10 {
		t.Fatalf("tally %s, event 4 handled %d times, checkpoint %d (position %d); want %s, twice (the second rolled back), 10 (10)",
			got, calls.Load(), seq, pos, once(10))
	}
	out := logs.String()
	if !strings.Contains(out, "the checkpoint holds this relayed event already") || strings.Contains(out, "moved under us") {
		t.Fatalf("the log does not say the checkpoint held event 4 already, or has a 'moved under us':\n%s", out)
	}
}
