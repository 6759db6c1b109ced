package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/schemaname"
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

	// The owner migrating while the runner's Up waits for the migration
	// lock: once the owner is done, the runner's Up has nothing to do.
	owner, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Release()
	k1, k2 := schemaname.MigrateLockKey(db.Schema)
	if _, err := owner.Exec(ctx, "SELECT pg_advisory_lock($1, $2)", k1, k2); err != nil {
		t.Fatal(err)
	}
	upErr := make(chan error, 1)
	go func() {
		done, err := migrations.Up(ctx, r.Pool, cfg)
		if err == nil && len(done) != 0 {
			err = errors.Newf("applied %v", done)
		}
		upErr <- err
	}()
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		var waiting bool
		err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE l.locktype = 'advisory' AND NOT l.granted AND a.usename = $1)`, r.Name).Scan(&waiting)
		return err == nil && waiting
	})
	if _, err := owner.Exec(ctx, `INSERT INTO `+schema+`.schema_migrations (version, name) VALUES ($1, 'again')`, last); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, "SELECT pg_advisory_unlock($1, $2)", k1, k2); err != nil {
		t.Fatal(err)
	}
	if err := <-upErr; err != nil {
		t.Fatalf("Up as a runner that waited for the owner's migration = %v, want nothing to do", err)
	}
}
