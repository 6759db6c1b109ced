package projection_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// slowApplier is a transactional projection that records each event it
// applies (no key: a second application is counted) after a short pause,
// so that batches are in flight most of the time.
type slowApplier struct{ name string }

func (s slowApplier) Name() string { return s.name }

func (s slowApplier) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	time.Sleep(100 * time.Microsecond)
	_, err := tx.Exec(ctx, `INSERT INTO applied_cb (sub, event_id) VALUES ($1, $2)`, s.name, e.ID)
	return err
}

// TestConnectionBound: a runner leading 64 partitions (4 projections × 16)
// holds at most 8 connections: one lock session for all 64 locks, the
// listener, and its pool (5 here: the batches in flight and the reads).
// Sessions are counted on the server while the partitions are led and
// their batches run, not in the moments after a kill (see below).
// Meanwhile the lock session's backend is terminated twice in the middle
// of batches: the batches run on pool connections, and the fence (the
// epoch, and the commit's check that the lock session still holds the
// lock) keeps every event applied exactly once.
func TestConnectionBound(t *testing.T) {
	t.Parallel()
	const (
		subs, parts = 4, 16
		poolSize    = 5
		limit       = 8
		events      = 3000
	)
	b := setup(t)
	ctx := t.Context()
	if _, err := b.db.Pool.Exec(ctx, `CREATE TABLE applied_cb (sub text NOT NULL, event_id uuid NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	if _, err := appendEvents(ctx, b.store, rng, events, nil); err != nil {
		t.Fatal(err)
	}
	const app = "connbound"
	pc, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = poolSize
	pc.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	cfg := testConfig(time.Second)
	cfg.LockRetryInterval = 0 // the default
	r, err := projection.NewRunner(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range subs {
		if err := r.Register(slowApplier{fmt.Sprintf("cb%d", i)}, &projection.Options{Partitions: parts, BatchSize: 50}); err != nil {
			t.Fatal(err)
		}
	}
	head := events
	var conns, maxConns atomic.Int64
	count := func() int64 {
		var n int64
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, app).Scan(&n); err != nil {
			t.Error(err)
		}
		conns.Store(n)
		for m := maxConns.Load(); n > m && !maxConns.CompareAndSwap(m, n); m = maxConns.Load() {
		}
		return n
	}
	led := func() int64 {
		var n int64
		if err := b.db.Pool.QueryRow(ctx, `
			SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			 WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1 AND a.datname = current_database()`, app).Scan(&n); err != nil {
			t.Error(err)
		}
		return n - subs // minus the member slots
	}
	caughtUp := func() int64 {
		var n int64
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.checkpoints WHERE position = $1`, head).Scan(&n); err != nil {
			t.Error(err)
		}
		return n
	}
	stop := runInBackground(t, r)
	defer stop()
	annalstest.WaitFor(t, 30*time.Second, func() bool { count(); return led() == subs*parts })
	// Kill the lock session twice while batches run (the handler keeps
	// them in flight), then let everything catch up.
	for k := range 2 {
		var pid int32
		if err := b.db.Pool.QueryRow(ctx, `
			SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			 WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1 AND a.datname = current_database()`, app).Scan(&pid); err != nil {
			t.Fatalf("kill %d: the lock session: %v", k, err)
		}
		applied := func() int64 {
			var n int64
			_ = b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM applied_cb`).Scan(&n)
			return n
		}
		before := applied()
		annalstest.WaitFor(t, 30*time.Second, func() bool { count(); return applied() > before+200 })
		var ok bool
		if err := b.db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
		}
		t.Logf("kill %d: terminated the lock session (pid %d) with %d of %d events applied", k+1, pid, applied(), subs*events)
		// Led again, on a new session. Not counted meanwhile: the killed
		// session, and the pool connections whose batches the lost lock
		// cut off (their sockets closed by Lease.Do), stay in
		// pg_stat_activity for a moment after the runner has let go of
		// them, while their replacements connect.
		annalstest.WaitFor(t, 30*time.Second, func() bool {
			var alive bool
			_ = b.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive)
			return !alive && led() == subs*parts
		})
	}
	annalstest.WaitFor(t, 120*time.Second, func() bool { count(); return caughtUp() == subs*parts })
	for range 5 {
		count()
		time.Sleep(20 * time.Millisecond)
	}
	var rows, distinct int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (sub, event_id)) FROM applied_cb`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != subs*events || distinct != subs*events {
		t.Fatalf("%d applications (%d distinct) of %d events × %d projections: not exactly once", rows, distinct, events, subs)
	}
	t.Logf("%d partitions led by one runner: at most %d connections (limit %d; pool %d)", subs*parts, maxConns.Load(), limit, poolSize)
	if m := maxConns.Load(); m > limit {
		t.Fatalf("the runner held %d connections leading %d partitions, want at most %d", m, subs*parts, limit)
	}
}
