package relay_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/relay"
	"github.com/annals-dev/annals/walsource"
)

// noReplicationPool returns a pool on b's database as a new role that has
// the privileges of the database's owner (a member of it) but not the
// REPLICATION attribute, which is not inherited.
func noReplicationPool(t *testing.T, b *bundle) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	role := "norepl_" + strings.TrimPrefix(b.db.Name, "annalstest_")
	var owner string
	if err := b.db.Pool.QueryRow(ctx, `SELECT current_user`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN NOREPLICATION IN ROLE "+pgx.Identifier{owner}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the pool below is closed
		if _, err := b.db.Pool.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Error(err)
		}
	})
	u, err := url.Parse(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, u.String()
}

// A relay woken from the WAL whose role lacks REPLICATION fails at once
// with ErrNoReplication: it ran on polling alone, its WAL source retrying
// the replication connection, refused with 42501, for ever.
func TestRelayWALNeedsReplication(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	appendMany(t, b.store, 2)
	if _, err := walsource.EnsurePublication(ctx, b.db.Pool, ""); err != nil {
		t.Fatal(err)
	}
	pool, _ := noReplicationPool(t, b)
	wake, err := walsource.NewWake(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(pool, b.nc, &relay.Config{Name: "walrelay", WAL: wake, RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithTimeout(ctx, 20*time.Second)
	defer stop()
	if err := r.CatchUp(runCtx); !errors.Is(err, relay.ErrNoReplication) || !strings.Contains(err.Error(), "REPLICATION") {
		t.Fatalf("CatchUp with the WAL and a role without REPLICATION: %v, want ErrNoReplication", err)
	}
}
