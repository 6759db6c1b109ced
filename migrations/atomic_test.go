package migrations_test

import (
	"context"
	"testing"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

// TestUpIsAllOrNothing: a migration that fails rolls back everything the same
// Up did, the CREATE SCHEMA included; on a migrated schema, a failing later
// migration also rolls back the ones before it in the same call.
func TestUpIsAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	all, err := migrations.All(nil)
	if err != nil {
		t.Fatal(err)
	}
	broken := func(extra ...migrations.Migration) func([]migrations.Migration) []migrations.Migration {
		return func(ms []migrations.Migration) []migrations.Migration {
			for i, m := range extra {
				m.Version = len(ms) + 1 + i
				extra[i] = m
			}
			return append(ms, extra...)
		}
	}
	exists := func(sql string, args ...any) bool {
		t.Helper()
		var ok bool
		if err := db.Pool.QueryRow(ctx, sql, args...).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	cfg := &migrations.Config{Schema: "allornothing"}

	if _, err := migrations.UpWith(ctx, db.Pool, cfg, broken(migrations.Migration{Name: "broken", SQL: `SELECT 1/0`})); err == nil {
		t.Fatal("Up with a failing migration succeeded")
	}
	if exists(`SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'allornothing')`) {
		t.Fatal("a failed Up left the schema behind")
	}

	done, err := migrations.Up(ctx, db.Pool, cfg)
	if err != nil || len(done) != len(all) {
		t.Fatalf("Up after the failed one applied %d of %d (%v)", len(done), len(all), err)
	}
	_, err = migrations.UpWith(ctx, db.Pool, cfg, broken(
		migrations.Migration{Name: "fine", SQL: `CREATE TABLE allornothing.fine (x int)`},
		migrations.Migration{Name: "broken", SQL: `SELECT 1/0`}))
	if err == nil {
		t.Fatal("Up with a failing migration succeeded")
	}
	if exists(`SELECT to_regclass('allornothing.fine') IS NOT NULL`) {
		t.Fatal("the migration before the failing one was kept")
	}
	if exists(`SELECT count(*) <> $1 FROM allornothing.schema_migrations`, len(all)) {
		t.Fatal("schema_migrations changed")
	}
}
