package scheduler

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// A lock_timeout of the role or the database (ALTER ROLE app SET
// lock_timeout = '300ms', common in production) does not apply to a
// dispatcher's claim: its append waits for the log's ordering lock, held by
// a long transaction, and fires once the lock is free. Every wait used to
// fail at 300 ms and cost the timer an attempt, and after MaxAttempts the
// valid timer was kept as failed, never to fire.
func TestServerLockTimeoutDoesNotFailTimers(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["lock_timeout"] = "300ms" // as ALTER ROLE … SET lock_timeout would
	pcfg.ConnConfig.RuntimeParams["statement_timeout"] = "600ms"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := eventstore.New(pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(store, &Config{Clock: newFakeClock(t0), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Schedule(ctx, nil, t0, "x", ev("x.y", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	// Another writer holds the log's ordering lock (a long import, say).
	other, err := eventstore.New(db.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := other.AppendTx(ctx, tx, "bulk", eventstore.Any, ev("bulk.row", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   int
		err error
	}
	fired := make(chan result, 1)
	go func() {
		n, err := s.FireDue(ctx)
		fired <- result{n, err}
	}()
	// The dispatcher has waited for the lock for longer than both timeouts.
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		return len(fired) > 0 || count(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND now() - query_start > interval '1.5 seconds'`) > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-fired
	if r.err != nil || r.n != 1 {
		infos, _ := s.Timers(ctx, 10)
		t.Fatalf("FireDue with the role's lock_timeout 300ms, behind a writer holding the log's lock: fired %d, %v (timers %+v); want 1", r.n, r.err, infos)
	}
	if got := eventsIn(t, db, "x"); got != 1 {
		t.Fatalf("the timer's event appended %d times; want 1", got)
	}
}

// Cancel of a timer that a dispatcher fires meanwhile reports false (it
// fired) when the server's default isolation is REPEATABLE READ: its
// transaction is READ COMMITTED whatever the default. It failed with a
// serialization error (40001).
func TestCancelUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := eventstore.New(pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	canceller, err := New(store, &Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.Schedule(ctx, nil, t0, "x", ev("x.y", map[string]any{}))
	if err != nil {
		t.Fatal(err)
	}
	race := holdFiring(t, s)
	type result struct {
		ok  bool
		err error
	}
	res := make(chan result, 1)
	go func() {
		ok, err := canceller.Cancel(ctx, nil, id)
		res <- result{ok, err}
	}()
	annalstest.WaitFor(t, 10*time.Second, func() bool { return len(res) > 0 || waitingForRowLock(t, db) })
	race.release()
	r := <-res
	if err := <-race.done; err != nil {
		t.Fatal(err)
	}
	if r.err != nil || r.ok {
		t.Fatalf("Cancel of a timer that fired meanwhile: %v, %v; want false, nil", r.ok, r.err)
	}
	if got := eventsIn(t, db, "x"); got != 1 {
		t.Fatalf("the timer's event appended %d times; want 1", got)
	}
}
