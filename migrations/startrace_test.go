package migrations_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

// atOnce runs fn(i, pool) for n pools of one connection each (processes)
// released together (annalstest's AtOnce) and returns their errors.
// isolation, when not empty, is the pools' default isolation.
func atOnce(t *testing.T, db *annalstest.DB, n int, isolation string, fn func(i int, pool *pgxpool.Pool) error) []error {
	t.Helper()
	return db.AtOnce(t, n, func(_ int, cfg *pgxpool.Config) {
		cfg.MaxConns = 1
		if isolation != "" {
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = isolation
		}
	}, fn)
}

// TestUpOfTwoSchemasAtOnceInOneDatabase: two services migrating schemas
// of their own in one database, four replicas each, released together,
// all succeed, also under a REPEATABLE READ default (TestUp's
// ConcurrentUp races one schema): the migrations make nothing outside
// their schema that the other's could collide with.
func TestUpOfTwoSchemasAtOnceInOneDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for _, iso := range []string{"", "repeatable read"} {
		for round := range 2 {
			// A subtest per round: its database and pools go at its end.
			t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
				db := annalstest.NewDB(t, nil)
				errs := atOnce(t, db, 8, iso, func(i int, pool *pgxpool.Pool) error {
					_, err := migrations.Up(ctx, pool, &migrations.Config{Schema: []string{"svc_a", "svc_b"}[i%2]})
					return err
				})
				for i, err := range errs {
					if err != nil {
						t.Fatalf("%q round %d: replica %d: %v", iso, round, i, err)
					}
				}
			})
		}
	}
}

// TestGrantsAtOnce: annals grant run several times at once (a writer twice
// on each of two schemas of one database, a runner on one and an
// operator on the other: deploy jobs of two services) all succeed, also
// under a REPEATABLE READ default: concurrent GRANTs on one object fail in
// PostgreSQL ("tuple concurrently updated", as the writers' did without
// Grant's lock on the schema), and Grant's locks make them take turns,
// the lock functions' included.
func TestGrantsAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for _, iso := range []string{"", "repeatable read"} {
		for round := range 2 {
			// A subtest per round: its database and pools go at its end.
			t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
				db := annalstest.NewDB(t, nil)
				if _, err := migrations.Up(ctx, db.Pool, &migrations.Config{Schema: "second"}); err != nil {
					t.Fatal(err)
				}
				w := newRole(t, db, migrations.Writer)
				r, o := newRole(t, db, migrations.Runner), newRole(t, db, migrations.Operator)
				errs := atOnce(t, db, 8, iso, func(i int, pool *pgxpool.Pool) error {
					role, kind := w.Name, migrations.Writer // twice on each schema
					switch i % 4 {
					case 2:
						role, kind = r.Name, migrations.Runner
					case 3:
						role, kind = o.Name, migrations.Operator
					}
					return migrations.Grant(ctx, pool, role, kind, &migrations.Config{Schema: []string{"annals", "second"}[i%2]})
				})
				for i, err := range errs {
					if err != nil {
						t.Fatalf("%q round %d: grant %d: %v", iso, round, i, err)
					}
				}
			})
		}
	}
}
