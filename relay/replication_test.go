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

	"github.com/annals-dev/annals/annalstest"
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

// A relay woken from the WAL whose role lacks REPLICATION, its Wake on the
// same pool, fails with ErrNoReplication once its WAL source has not
// started streaming in time: it ran on polling alone, its WAL source
// retrying the replication connection, refused with 42501, for ever.
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
	relay.SetWALCheck(r, 500*time.Millisecond, nil)
	runCtx, stop := context.WithTimeout(ctx, 20*time.Second)
	defer stop()
	if err := r.Run(runCtx); !errors.Is(err, relay.ErrNoReplication) || !strings.Contains(err.Error(), "REPLICATION") || runCtx.Err() != nil {
		t.Fatalf("Run with the WAL and a role without REPLICATION: %v, want ErrNoReplication", err)
	}
}

// A relay whose own role lacks REPLICATION, woken by a Wake built on
// another pool whose role has it, is not refused: the Wake streams. It was
// refused at once by the relay's own role's attributes, as is a role
// granted replication by a managed service's role (RDS: rds_replication),
// whose rolreplication stays false.
func TestRelayWALOnAnotherPool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	appendMany(t, b.store, 2)
	pool, _ := noReplicationPool(t, b)
	wake, err := walsource.NewWake(ctx, b.db.Pool, nil) // a superuser's pool
	if err != nil {
		t.Fatal(err)
	}
	verdicts := make(chan error, 10)
	r, err := relay.New(pool, b.nc, &relay.Config{Name: "walrelay", WAL: wake, RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	relay.SetWALCheck(r, 5*time.Second, func(err error) { verdicts <- err })
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	select {
	case err := <-verdicts:
		if err != nil {
			t.Fatalf("the relay refused a Wake that streams: %v", err)
		}
	case err := <-done:
		t.Fatalf("Run returned %v while the Wake streams", err)
	case <-ctx.Done():
		t.Fatal("no verdict on the WAL source")
	}
	appendMany(t, b.store, 3)
	annalstest.WaitFor(t, 30*time.Second, func() bool { return len(b.relayed("ANNALS")) == 5 })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
}

// A WAL source that stops for good ends the relay's Run at once, without
// waiting out the start timeout: with ErrNoReplication when the relay's own
// role is refused replication, with the source's walsource.PermanentError
// when the Wake's role (another pool) is refused and the relay's is not.
func TestRelayEndsWhenItsWALSourceStops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	appendMany(t, b.store, 2)
	if _, err := walsource.EnsurePublication(ctx, b.db.Pool, ""); err != nil {
		t.Fatal(err)
	}
	noRepl, _ := noReplicationPool(t, b)
	for _, c := range []struct {
		name        string
		relay, wake *pgxpool.Pool
		noRepl      bool
	}{
		{"RelaysRole", noRepl, noRepl, true},
		{"WakesRole", b.db.Pool, noRepl, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			wake, err := walsource.NewWake(ctx, c.wake, nil)
			if err != nil {
				t.Fatal(err)
			}
			r, err := relay.New(c.relay, b.nc, &relay.Config{Name: "walstop-" + c.name, Prefix: "walstop" + strings.ToLower(c.name), Stream: "WALSTOP" + strings.ToUpper(c.name), WAL: wake, RetryBackoff: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			relay.SetWALCheck(r, time.Hour, nil) // only the source's stop can end Run
			runCtx, stop := context.WithTimeout(ctx, 30*time.Second)
			defer stop()
			err = r.Run(runCtx)
			var perr *walsource.PermanentError
			switch {
			case runCtx.Err() != nil:
				t.Fatalf("Run with a WAL source that stopped for good: %v after its context ended", err)
			case c.noRepl && !errors.Is(err, relay.ErrNoReplication):
				t.Fatalf("Run: %v, want ErrNoReplication", err)
			case !c.noRepl && (errors.Is(err, relay.ErrNoReplication) || !errors.As(err, &perr) || perr.Code != "42501"):
				t.Fatalf("Run: %v, want the WAL source's PermanentError (42501) and not ErrNoReplication", err)
			}
		})
	}
}
