package scheduler

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// firingRace holds a dispatcher of s inside its claim of the due timers
// (rows locked, appends not sent) until release is called.
type firingRace struct {
	release func()
	done    chan error // FireDue's error
}

func holdFiring(t *testing.T, s *Scheduler) *firingRace {
	t.Helper()
	claimed := make(chan struct{})
	hold := make(chan struct{})
	r := &firingRace{release: sync.OnceFunc(func() { close(hold) }), done: make(chan error, 1)}
	t.Cleanup(r.release) // before the pools close, should the test fail early
	var once sync.Once
	s.afterClaim = func(pgx.Tx) {
		once.Do(func() { close(claimed); <-hold })
	}
	go func() {
		_, err := s.FireDue(context.Background())
		r.done <- err
	}()
	<-claimed
	return r
}

// cancelResult is what a Cancel (or CancelOwned) run in a goroutine returned.
type cancelResult struct {
	n   int
	err error
}

// waitingForRowLock reports whether a session of db waits for a lock (the
// cancellation waiting for the dispatcher: nothing else does).
func waitingForRowLock(t *testing.T, db *annalstest.DB) bool {
	return count(t, db, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%timers%'`) > 0
}

// A timer cancelled while a dispatcher fires it, whose append then fails,
// is cancelled: Cancel waits for the dispatcher's claim, which rolls back,
// and deletes the row before the dispatcher takes it again. It used to skip
// the held row and report false, and the timer, put back as failed once,
// fired later although it had been cancelled.
func TestCancelWhileFiringWhenTheAppendFails(t *testing.T) {
	t.Parallel()
	for _, owned := range []bool{false, true} {
		name := map[bool]string{false: "Cancel", true: "CancelOwned"}[owned]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := annalstest.NewDB(t, nil)
			clock := newFakeClock(t0)
			s := newScheduler(t, db, &Config{Clock: clock})
			ctx := t.Context()
			// Fails: the stream will never be at version 5.
			id, err := s.ScheduleTimer(ctx, nil, Timer{At: t0, StreamID: "x", Expected: eventstore.Exact(5), Owner: "o",
				Events: []eventstore.EventData{ev("x.y", map[string]any{})}})
			if err != nil {
				t.Fatal(err)
			}
			race := holdFiring(t, s)
			res := make(chan cancelResult, 1)
			go func() {
				if owned {
					n, err := s.CancelOwned(ctx, nil, "o")
					res <- cancelResult{n, err}
					return
				}
				ok, err := s.Cancel(ctx, nil, id)
				res <- cancelResult{map[bool]int{false: 0, true: 1}[ok], err}
			}()
			annalstest.WaitFor(t, 10*time.Second, func() bool { return len(res) > 0 || waitingForRowLock(t, db) })
			race.release()
			if r := <-res; r.n != 1 || r.err != nil {
				t.Fatalf("%s while the timer was being fired = %d, %v; want it cancelled", name, r.n, r.err)
			}
			if err := <-race.done; err != nil {
				t.Fatalf("FireDue: %v", err)
			}
			clock.Advance(time.Hour) // past any retry
			if n := fireDue(t, s); n != 0 || timerRows(t, db) != 0 || eventsIn(t, db, "x") != 0 {
				t.Errorf("after the cancellation: fired %d, %d timer rows, %d events; want none", n, timerRows(t, db), eventsIn(t, db, "x"))
			}
		})
	}
}

// A timer cancelled while a dispatcher fires it, whose append succeeds,
// fired: Cancel waits for the claim and reports false.
func TestCancelWhileFiringWhenTheAppendSucceeds(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})
	ctx := t.Context()
	id, err := s.Schedule(ctx, nil, t0, "x", ev("x.y", map[string]any{}))
	if err != nil {
		t.Fatal(err)
	}
	race := holdFiring(t, s)
	res := make(chan cancelResult, 1)
	go func() {
		ok, err := s.Cancel(ctx, nil, id)
		res <- cancelResult{map[bool]int{false: 0, true: 1}[ok], err}
	}()
	annalstest.WaitFor(t, 10*time.Second, func() bool { return len(res) > 0 || waitingForRowLock(t, db) })
	race.release()
	if r := <-res; r.n != 0 || r.err != nil {
		t.Fatalf("Cancel of a timer that fired meanwhile = %d, %v; want false", r.n, r.err)
	}
	if err := <-race.done; err != nil {
		t.Fatalf("FireDue: %v", err)
	}
	if timerRows(t, db) != 0 || eventsIn(t, db, "x") != 1 {
		t.Errorf("%d timer rows, %d events; want the timer fired once", timerRows(t, db), eventsIn(t, db, "x"))
	}
}

// Cancel in a transaction that holds the log's append lock (it appended, as
// a saga's does) while a dispatcher holds the timer and then waits for that
// lock: a deadlock, which PostgreSQL ends. Cancel fails with ErrTimerBusy
// (or, should the dispatcher be the one PostgreSQL ends, cancels the
// timer); either way the caller's transaction goes on, with its own
// lock_timeout, and the outcome is what Cancel said.
func TestCancelInATransactionThatBlocksTheFiringDispatcher(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})
	ctx := t.Context()
	id, err := s.Schedule(ctx, nil, t0, "cancel-race", ev("x", map[string]any{}))
	if err != nil {
		t.Fatal(err)
	}
	race := holdFiring(t, s)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '7s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.store.AppendTx(ctx, tx, "other", eventstore.Any, ev("y", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	pid := tx.Conn().PgConn().PID()
	res := make(chan cancelResult, 1)
	go func() {
		ok, err := s.Cancel(ctx, tx, id)
		res <- cancelResult{map[bool]int{false: 0, true: 1}[ok], err}
	}()
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		return len(res) > 0 || count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, int32(pid)) > 0
	})
	race.release() // its append now waits for tx's lock
	r := <-res
	if r.err != nil && !errors.Is(r.err, ErrTimerBusy) {
		t.Fatalf("Cancel = %d, %v; want ErrTimerBusy or a cancellation", r.n, r.err)
	}
	var lockTimeout string
	if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lockTimeout); err != nil || lockTimeout != "7s" {
		t.Fatalf("after Cancel the transaction's lock_timeout is %q (%v), want its own 7s", lockTimeout, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after Cancel: %v", err)
	}
	<-race.done
	fired := eventsIn(t, db, "cancel-race")
	t.Logf("Cancel = %d, %v; events fired %d", r.n, r.err, fired)
	if r.err != nil && fired != 1 || r.err == nil && (r.n != 1 || fired != 0) || eventsIn(t, db, "other") != 1 {
		t.Errorf("Cancel = %d, %v, and the timer fired %d times (the transaction's append: %d); want it to fire once if Cancel failed, never if it cancelled",
			r.n, r.err, fired, eventsIn(t, db, "other"))
	}
}
