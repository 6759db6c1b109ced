package natsconsumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/failure"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// errBadDeposit is the handler's error on the event it cannot handle.
var errBadDeposit = errors.New("bad deposit")

// returned waits (up to 10 s) for a Run or RunProjection started with done
// to return, and returns its error.
func returned(t *testing.T, done <-chan error) error {
	t.Helper()
	var err error
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	})
	return err
}

// checkHandlerError requires err to be the *natsconsumer.HandlerError of
// the permanent failure of the event at position 4 (stream message 4),
// matching the handler's error, failure.ErrPermanent and ErrHandlerFailed.
func checkHandlerError(t *testing.T, err error, durable string, id uuid.UUID) {
	t.Helper()
	if !errors.Is(err, errBadDeposit) || !errors.Is(err, failure.ErrPermanent) || !errors.Is(err, natsconsumer.ErrHandlerFailed) {
		t.Fatalf("returned %v; want the handler's error, failure.ErrPermanent and natsconsumer.ErrHandlerFailed", err)
	}
	var he *natsconsumer.HandlerError
	if !errors.As(err, &he) {
		t.Fatalf("returned %v; want a *natsconsumer.HandlerError", err)
	}
	want := natsconsumer.HandlerError{Consumer: durable, Stream: "ANNALS", Sequence: 4, Position: 4,
		EventID: id, Type: "deposited", StreamID: "acct-0", Err: he.Err}
	if *he != want || !errors.Is(he.Err, errBadDeposit) {
		t.Fatalf("HandlerError %+v; want %+v with the handler's error", *he, want)
	}
	for _, s := range []string{durable, "position 4", "stream message 4", id.String(), "deposited", "bad deposit"} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("the error %q does not say %q", err, s)
		}
	}
}

// checkLoggedOnce requires the log to report the permanent failure once,
// at ERROR level, and no retry.
func checkLoggedOnce(t *testing.T, logs *logBuffer) {
	t.Helper()
	out := logs.String()
	if n := strings.Count(out, "failed permanently"); n != 1 || !strings.Contains(out, "level=ERROR") ||
		strings.Contains(out, "retrying") {
		t.Fatalf("the log reports the permanent failure %d times; want once at ERROR, no retry:\n%s", n, out)
	}
	for _, s := range []string{"stream_seq=4", "position=4", "type=deposited", "bad deposit"} {
		if !strings.Contains(out, s) {
			t.Fatalf("the log does not say %s:\n%s", s, out)
		}
	}
}

// TestRunStopsOnAPermanentFailure: a handler error marked failure.Permanent
// (the mark a projection.Runner dead-letters at once) stops Run with it,
// wrapped in a *HandlerError naming the event, after one attempt and one
// ERROR line. The events after it were not handled, and the message was
// handed back: the next Run starts at that event again. Before, Run
// retried it for ever.
func TestRunStopsOnAPermanentFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 10)
	var (
		mu       sync.Mutex
		handled  []int64
		attempts int
		badID    uuid.UUID
	)
	var logs logBuffer
	cfg := &natsconsumer.Config{Durable: "run", Batch: 4, RetryBackoff: 20 * time.Millisecond, Logger: logs.logger()}
	run := func(ctx context.Context, fixed bool) <-chan error {
		c, err := natsconsumer.New(ctx, e.nc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			done <- c.Run(ctx, func(_ context.Context, ev eventstore.Event) error {
				mu.Lock()
				defer mu.Unlock()
				if ev.GlobalSequence == 4 && !fixed {
					attempts++
					badID = ev.ID
					return failure.Permanent(errors.Wrap(errBadDeposit, "deposit 4"))
				}
				handled = append(handled, ev.GlobalSequence)
				return nil
			})
		}()
		return done
	}

	err := returned(t, run(ctx, false))
	checkHandlerError(t, err, "run", badID)
	mu.Lock()
	if fmt.Sprint(handled) != "[1 2 3]" || attempts != 1 {
		t.Fatalf("handled %v, event 4 tried %d times; want [1 2 3], once", handled, attempts)
	}
	handled = nil
	mu.Unlock()
	checkLoggedOnce(t, &logs)

	// Fixed: the next Run starts at event 4 (at least once: 1..3 may come
	// again, before it).
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	done := run(cctx, true)
	from4 := func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		var h []int64
		for _, p := range handled {
			if p >= 4 {
				h = append(h, p)
			}
		}
		return h
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return len(from4()) >= 7 })
	stop()
	if err := returned(t, done); err != nil {
		t.Fatal(err)
	}
	if h := from4(); fmt.Sprint(h[:7]) != "[4 5 6 7 8 9 10]" {
		t.Fatalf("the fixed Run handled %v; want 4..10 in order", h)
	}
}

// failingTally is tally, failing permanently on the event at position at.
type failingTally struct {
	at       int64
	mu       *sync.Mutex
	attempts *int
	id       *uuid.UUID
}

func (failingTally) Name() string { return "tally" }

func (f failingTally) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if err := (tally{}).Handle(ctx, tx, e); err != nil {
		return err
	}
	if e.GlobalSequence == f.at {
		f.mu.Lock()
		defer f.mu.Unlock()
		*f.attempts++
		*f.id = e.ID
		return failure.Permanent(errors.Wrap(errBadDeposit, "deposit 4"))
	}
	return nil
}

// TestRunProjectionStopsOnAPermanentFailure: a projection's error marked
// failure.Permanent stops RunProjection with it, wrapped in a
// *HandlerError naming the event, after one attempt and one ERROR line;
// its transaction is rolled back and the checkpoint stays before the
// event. The next RunProjection, with the projection fixed, applies that
// event and the rest exactly once. Before, it retried the event for ever.
func TestRunProjectionStopsOnAPermanentFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 10)
	var logs logBuffer
	cfg := &natsconsumer.Config{Durable: "tally", Batch: 4, RetryBackoff: 20 * time.Millisecond, Logger: logs.logger()}
	c, err := natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		attempts int
		badID    uuid.UUID
	)
	done := make(chan error, 1)
	go func() {
		done <- c.RunProjection(ctx, e.dst.Pool, failingTally{at: 4, mu: &mu, attempts: &attempts, id: &badID})
	}()
	err = returned(t, done)
	mu.Lock()
	checkHandlerError(t, err, "tally", badID)
	if attempts != 1 {
		t.Fatalf("event 4 tried %d times; want once", attempts)
	}
	mu.Unlock()
	checkLoggedOnce(t, &logs)
	var seq, pos int64
	if err := e.dst.Pool.QueryRow(ctx, `SELECT stream_seq, position FROM annals.relay_checkpoints WHERE consumer = 'tally'`).Scan(&seq, &pos); err != nil {
		t.Fatal(err)
	}
	if got := e.tallied(ctx); got != once(3) || seq != 3 || pos != 3 {
		t.Fatalf("after the permanent failure: tally %s, checkpoint %d (position %d); want %s, 3 (3)", got, seq, pos, once(3))
	}

	// Fixed: from event 4 on, each once.
	c, err = natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, tally{}) })
	annalstest.WaitFor(t, 10*time.Second, func() bool { return e.tallied(ctx) == once(10) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := e.tallied(ctx); got != once(10) {
		t.Fatalf("after the fixed run: tally %s; want %s", got, once(10))
	}
}

// flakyTally is tally, failing (not permanently) the first fails times it
// gets the event at position at.
type flakyTally struct {
	at    int64
	fails int
	mu    *sync.Mutex
	tries *int
}

func (flakyTally) Name() string { return "tally" }

func (f flakyTally) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if e.GlobalSequence == f.at {
		f.mu.Lock()
		defer f.mu.Unlock()
		*f.tries++
		if *f.tries <= f.fails {
			return errors.Newf("deposit %d: try again", e.GlobalSequence)
		}
	}
	return tally{}.Handle(ctx, tx, e)
}

// TestATransientFailureIsRetried: a handler error not marked permanent is
// retried in place after RetryBackoff until it succeeds (a WARN at the
// first failure, see TestARetriedFailureIsLoggedOnceAMinute); Run and
// RunProjection go on, and the events after it are handled after it
// (RunProjection: each once).
func TestATransientFailureIsRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 10)
	var logs logBuffer
	var mu sync.Mutex

	// RunProjection.
	tries := 0
	c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "tally", Batch: 4, RetryBackoff: 20 * time.Millisecond, Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(ctx, func(ctx context.Context) error {
		return c.RunProjection(ctx, e.dst.Pool, flakyTally{at: 4, fails: 3, mu: &mu, tries: &tries})
	})
	annalstest.WaitFor(t, 10*time.Second, func() bool { return e.tallied(ctx) == once(10) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if tries != 4 {
		t.Fatalf("RunProjection tried event 4 %d times; want 4", tries)
	}
	mu.Unlock()

	// Run.
	var handled []int64
	runTries := 0
	c, err = natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "run", Batch: 4, RetryBackoff: 20 * time.Millisecond, Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	stop = start(ctx, func(ctx context.Context) error {
		return c.Run(ctx, func(_ context.Context, ev eventstore.Event) error {
			mu.Lock()
			defer mu.Unlock()
			if ev.GlobalSequence == 4 {
				if runTries++; runTries <= 3 {
					return errors.New("try again")
				}
			}
			handled = append(handled, ev.GlobalSequence)
			return nil
		})
	})
	annalstest.WaitFor(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) == 10 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(handled) != "[1 2 3 4 5 6 7 8 9 10]" || runTries != 4 {
		t.Fatalf("Run handled %v, tried event 4 %d times; want 1..10 in order, 4 tries", handled, runTries)
	}
	if n := strings.Count(logs.String(), "handling a relayed event failed; retrying"); n != 2 || strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("the log has %d retry WARNs; want 2 (one per run, at the first failure), and no ERROR:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "handled a relayed event after failures"); n != 2 {
		t.Fatalf("the log has %d INFOs of a success after failures; want 2:\n%s", n, logs.String())
	}
}
