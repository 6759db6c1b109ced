package walsource_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/walsource"
)

// A Source's replication connection logs in through the pool's
// BeforeConnect, at every dial (a rotated credential is picked up when it
// reconnects), and the pool's AfterConnect, which expects the ordinary
// protocol, is not run on it. The pool's ConnConfig names a role that does
// not exist: only BeforeConnect names one that does.
func TestSourceConnectsThroughPoolHooks(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	if _, err := walsource.EnsurePublication(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	rotated := newRole(t, db, "walrot_", "REPLICATION")
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	var user atomic.Value
	user.Store(cfg.ConnConfig.User)
	cfg.ConnConfig.User = "annals_placeholder_role"
	var before, replicationAfter atomic.Int64
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		before.Add(1)
		cc.User = user.Load().(string)
		return nil
	}
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		if c.Config().RuntimeParams["replication"] != "" {
			replicationAfter.Add(1)
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	slot := walsource.SlotName(db.Name, db.Schema, "hooked", 0)
	dropSlotAtEnd(t, db.Pool, slot)
	src, err := walsource.New(pool, &walsource.Config{Slot: slot, OnCommit: func(walsource.Commit) {}})
	if err != nil {
		t.Fatal(err)
	}
	runSource(t, src)
	// streamingAs returns the role and pid of the slot's walsender.
	streamingAs := func() (string, int32) {
		var name string
		var pid int32
		_ = db.Pool.QueryRow(ctx, `SELECT usename, pid FROM pg_stat_replication WHERE application_name = $1`,
			"annals walsource "+slot).Scan(&name, &pid)
		return name, pid
	}
	first := user.Load().(string)
	annalstest.WaitFor(t, 30*time.Second, func() bool { name, _ := streamingAs(); return name == first })
	calls := before.Load()

	user.Store(rotated)
	_, pid := streamingAs()
	if _, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 30*time.Second, func() bool { name, _ := streamingAs(); return name == rotated })
	if src.Reconnects() == 0 || before.Load() <= calls {
		t.Fatalf("after the walsender was ended: %d reconnects, BeforeConnect ran %d times (before: %d)", src.Reconnects(), before.Load(), calls)
	}
	if n := replicationAfter.Load(); n != 0 {
		t.Fatalf("AfterConnect ran on %d replication connections", n)
	}
}
