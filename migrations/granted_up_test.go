package migrations_test

import (
	"context"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

// A service on a role of its own (annals grant runner) calls Up at start
// (annals.Client.Start does): once the owner has migrated, Up does nothing
// and succeeds, though the role may not create schemas. With migrations
// pending it fails with ErrNotOwner, which says who migrates, and changes
// nothing.
func TestUpByAGrantedRole(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := context.Background()
	cfg := &migrations.Config{Schema: db.Schema}
	for _, kind := range []migrations.RoleKind{migrations.Reader, migrations.Writer, migrations.Runner, migrations.Operator} {
		r := newRole(t, db, kind)
		done, err := migrations.Up(ctx, r.Pool, cfg)
		if err != nil || len(done) != 0 {
			t.Fatalf("Up as %s on a current schema = %v, %v; want nothing done and no error", kind, done, err)
		}
	}

	schema := pgx.Identifier{db.Schema}.Sanitize()
	// The newest migration unrecorded: pending for every role.
	var last int
	if err := db.Pool.QueryRow(ctx, `DELETE FROM `+schema+`.schema_migrations
		WHERE version = (SELECT max(version) FROM `+schema+`.schema_migrations) RETURNING version`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	r := newRole(t, db, migrations.Runner)
	_, err := migrations.Up(ctx, r.Pool, cfg)
	if !errors.Is(err, migrations.ErrNotOwner) {
		t.Fatalf("Up as a runner with migration %d pending = %v, want ErrNotOwner", last, err)
	}
	t.Logf("the runner's error: %v", err)
	var recorded bool
	if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+schema+`.schema_migrations WHERE version = $1)`, last).Scan(&recorded); err != nil || recorded {
		t.Fatalf("migration %d recorded after the refused Up: %v, %v", last, recorded, err)
	}
}
