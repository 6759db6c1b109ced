package migrations_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

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
