package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/hookedpool"
	"github.com/annals-dev/annals/projection"
)

// A pool whose login comes from BeforeConnect (pgxpool's hook for
// credentials that rotate, such as an RDS IAM token; here the user name,
// over a placeholder that does not exist): the runner's own sessions (the
// lock session, its listener, a rebuild's locks) log in through it too, so the
// projection leads, applies events and rebuilds.
func TestRunnerWithBeforeConnectPool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	hp := hookedpool.New(t, b.db.URL, "")
	pool, before, after := hp.Pool, hp.Before, hp.After
	r, err := projection.NewRunner(pool, &projection.Config{PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p := balances(b.reg)
	p.OnReset(func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, `DELETE FROM balances`); return err })
	if err := r.Register(p, nil); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done, err := r.Start(rctx)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { cancel(); <-done })
	if _, err := b.store.Append(ctx, "acct-1", eventstore.Any, eventstore.NewEvent(Deposited{Amount: 5})); err != nil {
		t.Fatal(err)
	}
	amount := func() int64 {
		var n int64
		_ = b.db.Pool.QueryRow(ctx, `SELECT amount FROM balances WHERE account = 'acct-1'`).Scan(&n)
		return n
	}
	annalstest.WaitFor(t, 15*time.Second, func() bool { return amount() == 5 })
	// The runner's LISTEN connection logged in through the hooks too (a
	// runner whose listener cannot connect falls back to polling).
	annalstest.WaitFor(t, 15*time.Second, func() bool {
		var n int
		err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n)
		return err == nil && n > 0
	})

	// A rebuild takes its own lock and the partition's (TakeOver) on
	// sessions of their own.
	if err := r.Rebuild(ctx, "balances", &projection.RebuildOptions{LockTimeout: 10 * time.Second}); err != nil {
		t.Fatalf("Rebuild: %+v", err)
	}
	if n := amount(); n != 5 {
		t.Fatalf("amount %d after the rebuild; want 5", n)
	}
	if bc, ac := before.Load(), after.Load(); bc != ac || int64(pool.Stat().TotalConns()) >= bc {
		t.Fatalf("BeforeConnect ran %d times, AfterConnect %d times, for %d pool connections; want both once per connection, the runner's own included", bc, ac, pool.Stat().TotalConns())
	}
}
