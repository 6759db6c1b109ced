package migrations_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/migrations"
)

// TestUpThroughATransactionPooler: Up through PgBouncer in transaction mode
// (two server sessions, three clients at once, each migrating its own
// schema, then all three the same one) applies every migration once and
// leaves no migration lock behind on the pooler's server sessions. Up held
// a session lock across transactions: its unlock could run on another
// server session than the lock, which then stayed until PgBouncer closed
// that session, blocking the next Up of the schema.
func TestUpThroughATransactionPooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	pooled, _ := annalstest.PgBouncer(t, db.URL, nil)
	var pools []*pgxpool.Pool
	for range 3 {
		cfg, err := pgxpool.ParseConfig(pooled)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pools = append(pools, pool)
	}
	up := func(schemas ...string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, len(pools))
		for i, pool := range pools {
			wg.Go(func() {
				_, errs[i] = migrations.Up(ctx, pool, &migrations.Config{Schema: schemas[i%len(schemas)]})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("Up of %q through the pooler: %v", schemas[i%len(schemas)], err)
			}
		}
	}
	var schemas []string
	for round := range 3 {
		own := []string{fmt.Sprintf("pooled_%d_a", round), fmt.Sprintf("pooled_%d_b", round), fmt.Sprintf("pooled_%d_c", round)}
		schemas = append(schemas, own...)
		up(own...)
	}
	up("pooled_shared")
	schemas = append(schemas, "pooled_shared")
	t.Cleanup(func() {
		for _, s := range schemas {
			_, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		}
	})
	all, err := migrations.All(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range schemas {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{s, "schema_migrations"}.Sanitize()).Scan(&n); err != nil || n != len(all) {
			t.Errorf("%s: %d migrations recorded (%v), want %d", s, n, err, len(all))
		}
		k1, k2 := schemaname.MigrateLockKey(s)
		var held int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_locks
			WHERE locktype = 'advisory' AND objsubid = 2 AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
			  AND classid = ($1::int4::int8 & 4294967295)::oid AND objid = ($2::int4::int8 & 4294967295)::oid`, k1, k2).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held != 0 {
			t.Errorf("%s: its migration lock is still held (%d) after Up returned", s, held)
		}
	}
}

// TestUpWaitsForAnOlderUpsSessionLock: an Up of an older annals held the
// migration lock as a session lock; this one takes it for its transaction.
// The two must still exclude each other during a rolling upgrade: while a
// session holds the key, Up waits, and it migrates once it is given back.
func TestUpWaitsForAnOlderUpsSessionLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	const schema = "older_up"
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	old, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Release()
	k1, k2 := schemaname.MigrateLockKey(schema)
	if _, err := old.Exec(ctx, "SELECT pg_catalog.pg_advisory_lock($1::int4, $2::int4)", k1, k2); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := migrations.Up(ctx, db.Pool, &migrations.Config{Schema: schema})
		done <- err
	}()
	// Up waits in the lock queue: its backend shows a wait on an advisory lock.
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_locks
			WHERE locktype = 'advisory' AND NOT granted
			  AND classid = ($1::int4::int8 & 4294967295)::oid AND objid = ($2::int4::int8 & 4294967295)::oid`, k1, k2).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	select {
	case err := <-done:
		t.Fatalf("Up returned (%v) while an older Up's session lock was held", err)
	default:
	}
	if _, err := old.Exec(ctx, "SELECT pg_catalog.pg_advisory_unlock($1::int4, $2::int4)", k1, k2); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Up after the older Up's lock was given back: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Up did not finish within 30 s of the lock being given back")
	}
}
