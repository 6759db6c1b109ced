package annalstest

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SetDefaultIsolation makes level ("repeatable read", "serializable") the
// default_transaction_isolation of the database's new sessions, as ALTER
// DATABASE ... SET does on a database an organisation runs at a stricter
// level: pools opened after it (NewPool) get it, and so do the connections
// annals opens outside them; db.Pool's connections opened before keep READ
// COMMITTED, which suits a test's own holding transactions.
func (db *DB) SetDefaultIsolation(t testing.TB, level string) {
	t.Helper()
	switch level {
	case "read committed", "repeatable read", "serializable":
	default:
		t.Fatalf("annalstest: isolation level %q: want read committed, repeatable read or serializable", level)
	}
	if _, err := db.Pool.Exec(t.Context(), `ALTER DATABASE `+pgx.Identifier{db.Name}.Sanitize()+
		` SET default_transaction_isolation = '`+level+`'`); err != nil {
		t.Fatalf("annalstest: set the default isolation to %q: %v", level, err)
	}
	db.isolation = level
}

// NewPool opens a pool of its own on the database, as another process of
// a service would, closed when the test ends; each configure function may
// change its configuration first. After SetDefaultIsolation it checks that
// the pool's sessions have that default (unless configure chose another).
func (db *DB) NewPool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatalf("annalstest: %v", err)
	}
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatalf("annalstest: open a pool: %v", err)
	}
	t.Cleanup(pool.Close)
	if want := db.isolation; want != "" && cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] == "" {
		var got string
		if err := pool.QueryRow(t.Context(), `SHOW default_transaction_isolation`).Scan(&got); err != nil || got != want {
			t.Fatalf("annalstest: the new pool's default_transaction_isolation is %q (%v), want %q", got, err, want)
		}
	}
	return pool
}

// WaitForLockWaiter polls pool's database, for 30 seconds at most, until a
// session waits for the transaction- or session-level advisory lock (k1,
// k2) (two int4 keys, as internal/lockkey makes them): the moment to let a
// test's holder of that lock go, when the waiter must meet it.
func WaitForLockWaiter(ctx context.Context, pool *pgxpool.Pool, k1, k2 int32) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2)`, k1, k2).Scan(&waiting)
		if err != nil {
			return errors.Wrapf(err, "annalstest: wait for a session waiting for advisory lock (%d, %d)", k1, k2)
		}
		if waiting {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Wrapf(ctx.Err(), "annalstest: no session waited for advisory lock (%d, %d)", k1, k2)
		case <-tick.C:
		}
	}
}
