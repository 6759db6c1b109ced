package projection_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// A lock_timeout set on the database (a common production guard, meant for
// the application's statements) does not cut short a Rebuild's wait for
// the live leader's lock: RebuildOptions.LockTimeout alone bounds it.
func TestRebuildUnderServerLockTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if _, err := b.db.Pool.Exec(ctx, `CREATE TABLE lt_log (event_id uuid NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := b.store.Append(ctx, fmt.Sprintf("a-%d", i), eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
			t.Fatal(err)
		}
	}
	var dbname string
	if err := b.db.Pool.QueryRow(ctx, `SELECT current_database()`).Scan(&dbname); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{dbname}.Sanitize()+` SET lock_timeout = '500ms'`); err != nil {
		t.Fatal(err)
	}
	// A pool opened after the setting: its sessions (and the runner's own)
	// have it.
	pool, err := pgxpool.NewWithConfig(ctx, b.db.Pool.Config().Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var handled atomic.Int64
	r, err := projection.NewRunner(pool, &projection.Config{PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p := projection.New("lt", b.reg)
	p.OnReset(func(ctx context.Context, tx pgx.Tx) error { _, err := tx.Exec(ctx, `DELETE FROM lt_log`); return err })
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Deposited]) error {
		handled.Add(1)
		// A slow handler: the live leader's batch takes 1.5s, far above
		// the database's lock_timeout.
		select {
		case <-time.After(150 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := tx.Exec(ctx, `INSERT INTO lt_log VALUES ($1)`, e.ID)
		return err
	})
	if err := r.Register(p, &projection.Options{BatchSize: 10}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done, err := r.Start(rctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-done })
	annalstest.WaitFor(t, 10*time.Second, func() bool { return handled.Load() > 0 }) // mid-batch

	start := time.Now()
	if err := r.Rebuild(ctx, "lt", &projection.RebuildOptions{LockTimeout: 30 * time.Second}); err != nil {
		t.Fatalf("Rebuild (LockTimeout 30s) under the database's lock_timeout of 500ms, after %v: %+v", time.Since(start), err)
	}
	var n int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(DISTINCT event_id) FROM lt_log`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 20 {
		t.Fatalf("%d events in the rebuilt read model; want 20", n)
	}
}
