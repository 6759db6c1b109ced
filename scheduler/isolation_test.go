package scheduler

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// newIsolatedScheduler is newScheduler on a pool whose sessions begin every
// transaction at the isolation level iso (default_transaction_isolation),
// as a server or role configured so would.
func newIsolatedScheduler(t *testing.T, db *annalstest.DB, cfg *Config, iso string) *Scheduler {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 4
	pcfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = iso
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var got string
	if err := pool.QueryRow(t.Context(), `SHOW default_transaction_isolation`).Scan(&got); err != nil || got != iso {
		t.Fatalf("default_transaction_isolation = %q (%v), want %q", got, err, iso)
	}
	store, err := eventstore.New(pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// On a server whose default isolation is REPEATABLE READ or SERIALIZABLE,
// every claim (of timers, a batch or one alone, and of a cron task's tick)
// runs READ COMMITTED: an append to the claim's stream that commits while
// the claim is open does not make the claim's append fail to serialize. It
// did (40001): the batch was rolled back, each timer fired alone failed
// the same way, and with MaxAttempts 1 every timer ended failed.
func TestClaimsRunReadCommitted(t *testing.T) {
	t.Parallel()
	for _, iso := range []string{"repeatable read", "serializable"} {
		t.Run(strings.ReplaceAll(iso, " ", "_"), func(t *testing.T) {
			t.Parallel()
			db := annalstest.NewDB(t, nil)
			clock := newFakeClock(t0)
			s := newIsolatedScheduler(t, db, &Config{Clock: clock, MaxAttempts: 1}, iso)
			other, err := eventstore.New(db.Pool, nil) // another session, at the default READ COMMITTED
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			if _, err := other.Append(ctx, "iso", eventstore.NoStream, ev("other", map[string]any{})); err != nil {
				t.Fatal(err)
			}
			const n = 3
			for i := range n {
				if _, err := s.Schedule(ctx, nil, t0, "iso", ev("tick", map[string]any{"n": i})); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.AddTask(ctx, Task{Name: "cron", Spec: "* * * * * *", StreamID: "iso"}); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var levels []string
			s.afterClaim = func(tx pgx.Tx) {
				var level string
				if err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&level); err != nil {
					t.Error(err)
				}
				mu.Lock()
				levels = append(levels, level)
				mu.Unlock()
				if _, err := other.Append(ctx, "iso", eventstore.Any, ev("other", map[string]any{})); err != nil {
					t.Error(err)
				}
			}
			clock.Advance(time.Second)
			if got := fireDue(t, s); got != n+1 {
				ts, _ := s.Timers(ctx, 10)
				t.Fatalf("FireDue fired %d timers and ticks, want %d and 1; timers left: %+v", got, n, ts)
			}
			checkEachOnce(t, db, n)
			if timerRows(t, db) != 0 {
				t.Error("timers left after FireDue")
			}
			if got := count(t, db, `SELECT count(*) FROM annals.events WHERE stream_id = 'iso' AND event_type = $1`, TickEventType); got != 1 {
				t.Errorf("%d cron ticks fired, want 1", got)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(levels) == 0 {
				t.Fatal("no claim was seen")
			}
			for _, l := range levels {
				if l != "read committed" {
					t.Fatalf("claims ran at %q; want every one read committed", levels)
				}
			}
		})
	}
}

// A serialization failure or a deadlock is a lost race, not an attempt:
// the timer is retried, its attempts unchanged, so that a timer that only
// lost a few races never ends failed (with MaxAttempts 1 it did at the
// first). Each race lost in a row doubles the wait from RetryBackoff up to
// MaxRetryBackoff (it was RetryBackoff, forever), and the
// 10 × MaxAttempts-th counts as an attempt, so that a timer that never wins
// ends failed. Another failure counts, and resets the lost races.
func TestRaceLostIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	s := newScheduler(t, db, &Config{Clock: newFakeClock(t0), MaxAttempts: 1, RetryBackoff: 7 * time.Second, MaxRetryBackoff: time.Minute})
	ctx := t.Context()
	stored := func(id TimerID) claimed {
		t.Helper()
		c := claimed{id: id}
		if err := db.Pool.QueryRow(ctx, `SELECT attempts, lost_races, due_at FROM annals.timers WHERE id = $1`, id).
			Scan(&c.attempts, &c.lost, &c.dueAt); err != nil {
			t.Fatal(err)
		}
		return c
	}
	codes := []string{"40001", "40P01"}
	race := func(i int) error {
		return fmt.Errorf("append: %w", &pgconn.PgError{Severity: "ERROR", Code: codes[i%2]})
	}
	id, err := s.Schedule(ctx, nil, t0, "s", ev("x", map[string]any{}))
	if err != nil {
		t.Fatal(err)
	}
	wait := 7 * time.Second
	for i := 1; i < 10; i++ {
		now := t0.Add(time.Duration(i) * time.Hour)
		if err := s.fail(ctx, now, stored(id), race(i)); err != nil {
			t.Fatal(err)
		}
		ts, err := s.Timers(ctx, 10)
		if err != nil || len(ts) != 1 {
			t.Fatalf("Timers = %+v, %v", ts, err)
		}
		if c := stored(id); ts[0].Failed() || ts[0].Attempts != 0 || c.lost != i || !ts[0].DueAt.Equal(now.Add(wait)) ||
			!strings.Contains(ts[0].LastError, codes[i%2]) {
			t.Fatalf("after %d lost races: %+v, lost_races %d; want pending, 0 attempts, %d lost, due at %s, the error recorded",
				i, ts[0], c.lost, i, now.Add(wait))
		}
		wait = min(2*wait, time.Minute)
	}
	// A stale record (another dispatcher recorded a failure since) changes nothing.
	stale := stored(id)
	stale.lost--
	if err := s.fail(ctx, t0, stale, race(0)); err != nil {
		t.Fatal(err)
	}
	if c := stored(id); c.lost != 9 {
		t.Fatalf("a stale record changed lost_races to %d", c.lost)
	}
	if err := s.fail(ctx, t0.Add(10*time.Hour), stored(id), race(10)); err != nil {
		t.Fatal(err)
	}
	if ts, err := s.Timers(ctx, 10); err != nil || len(ts) != 1 || !ts[0].Failed() || ts[0].Attempts != 1 ||
		!strings.Contains(ts[0].LastError, "10 serialization failures or deadlocks in a row") {
		t.Fatalf("after 10 lost races in a row: %+v, %v; want failed after 1 attempt (MaxAttempts 1), saying why", ts, err)
	}
	if _, err := s.Cancel(ctx, nil, id); err != nil {
		t.Fatal(err)
	}

	id, err = s.Schedule(ctx, nil, t0, "s", ev("x", map[string]any{}))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := s.fail(ctx, t0, stored(id), race(i)); err != nil {
			t.Fatal(err)
		}
	}
	wrong := &eventstore.WrongExpectedVersionError{StreamID: "s", Expected: eventstore.Exact(3)}
	if err := s.fail(ctx, t0, stored(id), wrong); err != nil {
		t.Fatal(err)
	}
	if ts, err := s.Timers(ctx, 10); err != nil || len(ts) != 1 || !ts[0].Failed() || ts[0].Attempts != 1 || stored(id).lost != 0 {
		t.Fatalf("after a wrong expected version: %+v, %v, lost_races %d; want failed after 1 attempt, no lost races", ts, err, stored(id).lost)
	}
}

// Three dispatchers on a REPEATABLE READ server, with MaxAttempts 1, fire
// a backlog of timers of one stream, each once; none ends failed (most
// did, each claim's append racing the others' on the stream's row).
func TestRepeatableReadBacklogAllFire(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	var ss []*Scheduler
	for range 3 {
		ss = append(ss, newIsolatedScheduler(t, db, &Config{BatchSize: 10, MaxAttempts: 1,
			RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond}, "repeatable read"))
	}
	const n = 300
	tx, err := db.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	for i := range n {
		if _, err := ss[0].Schedule(t.Context(), tx, time.Now(), "one-stream", ev("tick", map[string]any{"n": i})); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		run(t, s)
	}
	annalstest.WaitFor(t, 60*time.Second, func() bool {
		return count(t, db, `SELECT count(*) FROM annals.timers WHERE failed_at IS NULL`) == 0
	})
	if failed := count(t, db, `SELECT count(*) FROM annals.timers`); failed != 0 {
		t.Fatalf("%d of %d timers failed", failed, n)
	}
	checkEachOnce(t, db, n)
}
