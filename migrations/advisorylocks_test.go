package migrations_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
)

// restrictAdvisoryLocks takes the lock functions from PUBLIC in db's
// database (the database is the test's own) and checks that it says so.
func restrictAdvisoryLocks(t *testing.T, db *annalstest.DB) *migrations.AdvisoryLockAccess {
	t.Helper()
	a, err := migrations.RestrictAdvisoryLocks(context.Background(), db.Pool)
	if err != nil {
		t.Fatalf("restrict advisory locks: %v", err)
	}
	if !a.Restricted {
		t.Fatalf("after RestrictAdvisoryLocks: %+v, want restricted", a)
	}
	return a
}

// lockCalls are a call of each function that takes an advisory lock, each
// in a transaction of its own (the transaction locks end with it).
var lockCalls = []string{
	"SELECT pg_advisory_lock(11)", "SELECT pg_advisory_lock(11, 12)",
	"SELECT pg_advisory_lock_shared(11)", "SELECT pg_advisory_lock_shared(11, 12)",
	"SELECT pg_try_advisory_lock(11)", "SELECT pg_try_advisory_lock(11, 12)",
	"SELECT pg_try_advisory_lock_shared(11)", "SELECT pg_try_advisory_lock_shared(11, 12)",
	"SELECT pg_advisory_xact_lock(11)", "SELECT pg_advisory_xact_lock(11, 12)",
	"SELECT pg_advisory_xact_lock_shared(11)", "SELECT pg_advisory_xact_lock_shared(11, 12)",
	"SELECT pg_try_advisory_xact_lock(11)", "SELECT pg_try_advisory_xact_lock(11, 12)",
	"SELECT pg_try_advisory_xact_lock_shared(11)", "SELECT pg_try_advisory_xact_lock_shared(11, 12)",
}

// mayLock runs stmt as r on a connection of its own (so that a session lock
// it takes ends with it) and returns the error.
func mayLock(t *testing.T, r *role, stmt string) error {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, r.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, stmt)
	return err
}

func TestRestrictAdvisoryLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	writer := newRole(t, db, migrations.Writer)
	runner := newRole(t, db, migrations.Runner)
	operator := newRole(t, db, migrations.Operator)
	reader := newRole(t, db, migrations.Reader)
	stranger := newRole(t, db, "") // CONNECT, as every role has by default; nothing in the schema
	// A runner granted before grant.sql named the lock functions:
	// RestrictAdvisoryLocks finds it by what it may do.
	oldRunner := newRole(t, db, migrations.Runner)
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`REVOKE EXECUTE ON FUNCTION pg_catalog.pg_advisory_xact_lock(integer, integer),
		pg_catalog.pg_try_advisory_lock(integer, integer), pg_catalog.pg_advisory_lock(integer, integer),
		pg_catalog.pg_try_advisory_xact_lock_shared(integer, integer) FROM %s`, pgx.Identifier{oldRunner.Name}.Sanitize())); err != nil {
		t.Fatal(err)
	}

	// PostgreSQL's default: everyone.
	before, err := migrations.AdvisoryLocks(ctx, stranger.Pool)
	if err != nil {
		t.Fatalf("status as a role granted nothing: %v", err)
	}
	if before.Restricted {
		t.Fatalf("a new database reads as restricted: %+v", before)
	}
	if err := mayLock(t, stranger, "SELECT pg_advisory_lock(11, 12)"); err != nil {
		t.Fatalf("before the restriction: %v", err)
	}

	// Only a superuser may change it.
	if _, err := migrations.RestrictAdvisoryLocks(ctx, operator.Pool); !errors.Is(err, migrations.ErrNotSuperuser) {
		t.Fatalf("restrict as the operator: %v, want ErrNotSuperuser", err)
	}
	// The cause first, then what to do.
	const missingOwner = `migrations: role "annals_no_such_owner", named as an owner, does not exist: create it first (CREATE ROLE "annals_no_such_owner" ...)`
	if _, err := migrations.RestrictAdvisoryLocks(ctx, db.Pool, "annals_no_such_owner"); !errors.Is(err, migrations.ErrRoleNotFound) || err.Error() != missingOwner {
		t.Fatalf("restrict naming a missing owner: %v, want ErrRoleNotFound reading %q", err, missingOwner)
	}
	a := restrictAdvisoryLocks(t, db)
	for _, want := range []struct {
		list []string
		what string
	}{{a.Runners, "runners"}, {a.Roles, "roles granted lock functions"}} {
		for _, r := range []*role{runner, operator, oldRunner} {
			if !slices.Contains(want.list, r.Name) {
				t.Errorf("%s %v lack %s", want.what, want.list, r.Name)
			}
		}
		for _, r := range []*role{writer, reader, stranger} {
			if slices.Contains(want.list, r.Name) {
				t.Errorf("%s %v hold %s", want.what, want.list, r.Name)
			}
		}
	}
	again, err := migrations.RestrictAdvisoryLocks(ctx, db.Pool)
	if err != nil || !again.Restricted || !slices.Equal(again.Roles, a.Roles) {
		t.Fatalf("restricting again: %+v, %v; want the same as %+v", again, err, a)
	}

	// A role that may merely connect, a reader and a writer take no lock
	// of their choosing at all.
	for _, r := range []*role{stranger, reader, writer} {
		for _, call := range lockCalls {
			mustDeny(t, r.Name+": "+call, mayLock(t, r, call))
		}
	}
	// The writer takes its two locks through the schema's functions
	// (snapshot writes, inline projections), and appends.
	for _, call := range []string{
		"SELECT " + rel(db, "snapshot_lock") + "()",
		"SELECT " + rel(db, "inline_stream_lock") + "('order-1')",
	} {
		if err := mayLock(t, writer, call); err != nil {
			t.Errorf("writer: %s: %v", call, err)
		}
	}
	store, err := eventstore.New(writer.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "order-1", eventstore.NoStream, eventstore.EventData{Type: "Placed", Data: map[string]int{}}); err != nil {
		t.Errorf("the writer appends once restricted: %v", err)
	}
	// A runner and an operator take session locks (leader elections), on
	// the key form annals uses only.
	for _, r := range []*role{runner, operator, oldRunner} {
		for _, call := range []string{"SELECT pg_try_advisory_lock(11, 12)", "SELECT pg_advisory_lock(11, 12)",
			"SELECT pg_try_advisory_xact_lock_shared(11, 12)", "SELECT pg_advisory_xact_lock(11, 12)"} {
			if err := mayLock(t, r, call); err != nil {
				t.Errorf("%s: %s: %v", r.Name, call, err)
			}
		}
		mustDeny(t, r.Name+": the bigint form", mayLock(t, r, "SELECT pg_advisory_lock(11)"))
	}
	// A runner granted (by a superuser) after the restriction gets its lock
	// functions from Grant; a writer needs none.
	late := newRole(t, db, migrations.Runner)
	if err := mayLock(t, late, "SELECT pg_try_advisory_lock(11, 12)"); err != nil {
		t.Errorf("a runner granted after the restriction: %v", err)
	}

	// Undone: everyone again.
	b, err := migrations.AllowAdvisoryLocks(ctx, db.Pool)
	if err != nil || b.Restricted {
		t.Fatalf("allow: %+v, %v", b, err)
	}
	if err := mayLock(t, stranger, "SELECT pg_advisory_lock(11, 12)"); err != nil {
		t.Errorf("after AllowAdvisoryLocks: %v", err)
	}
}

// TestRestrictAdvisoryLocksOwners: the functions of annals run as the role
// that created them, which need not be the schema's owner nor a superuser.
// Here a superuser creates the schema and a deployer role migrates it: the
// restriction finds the deployer by the functions it owns, so that what
// they run (forget_subject and the append functions take locks) goes on. A
// role that will migrate a new schema is named with --owner; the first
// grant of a runner needs a superuser from then on, a writer's does not.
func TestRestrictAdvisoryLocksOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	// Every role first: the schema is dropped before them (cleanups run
	// last first), with the privileges the deployer granted on it, which
	// a superuser's DROP OWNED BY leaves (they are not the owner's).
	deployer := newRole(t, db, "")
	writer, runner := newRole(t, db, ""), newRole(t, db, "")
	newWriter, newRunner := newRole(t, db, ""), newRole(t, db, "")
	future, unnamed := newRole(t, db, ""), newRole(t, db, "")
	schema := "owned_" + deployer.Name[len(deployer.Name)-6:]
	ident := pgx.Identifier{schema}.Sanitize()
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+ident+" CASCADE") })
	for _, s := range []string{
		"CREATE SCHEMA " + ident,
		// With the grant option: the deployer grants the roles USAGE on it.
		fmt.Sprintf("GRANT USAGE, CREATE ON SCHEMA %s TO %s WITH GRANT OPTION", ident, pgx.Identifier{deployer.Name}.Sanitize()),
		fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s", pgx.Identifier{db.Name}.Sanitize(), pgx.Identifier{deployer.Name}.Sanitize()),
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	cfg := &migrations.Config{Schema: schema}
	if _, err := migrations.Up(ctx, deployer.Pool, cfg); err != nil {
		t.Fatalf("migrate as a role that is no superuser: %v", err)
	}
	// Granted by the deployer while PUBLIC has the lock functions: it has
	// no grant option on them, so Grant leaves them out.
	if n, err := migrations.GrantCounted(ctx, deployer.Pool, writer.Name, migrations.Writer, cfg); err != nil {
		t.Fatalf("the deployer grants writer: %v", err)
	} else if all, _ := migrations.GrantSQL(writer.Name, migrations.Writer, cfg); n != len(all) {
		t.Errorf("a writer's grant ran %d of %d statements, want all (it has no lock statements)", n, len(all))
	}
	if n, err := migrations.GrantCounted(ctx, deployer.Pool, runner.Name, migrations.Runner, cfg); err != nil {
		t.Fatalf("the deployer grants runner: %v", err)
	} else if all, _ := migrations.GrantSQL(runner.Name, migrations.Runner, cfg); n != len(all)-4 {
		t.Errorf("the deployer's runner grant ran %d of %d statements, want all but the 4 lock functions", n, len(all))
	}

	// A role that will migrate a schema of its own later.
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s",
		pgx.Identifier{db.Name}.Sanitize(), pgx.Identifier{future.Name}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s",
		pgx.Identifier{db.Name}.Sanitize(), pgx.Identifier{unnamed.Name}.Sanitize())); err != nil {
		t.Fatal(err)
	}

	a, err := migrations.RestrictAdvisoryLocks(ctx, db.Pool, future.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(a.Owners, deployer.Name) || !slices.Contains(a.Runners, runner.Name) || slices.Contains(a.Runners, writer.Name) {
		t.Fatalf("after the restriction: %+v; want owner %s and runner %s, not the writer", a, deployer.Name, runner.Name)
	}
	store, err := eventstore.New(writer.Pool, &eventstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "early", eventstore.NoStream, eventstore.EventData{Type: "Placed", Data: map[string]int{}}); err != nil {
		t.Fatalf("the writer appends through the deployer's function once restricted: %v", err)
	}
	// forget_subject takes Forget's lock (the bigint form) as the deployer.
	if _, err := writer.Pool.Exec(ctx, "SELECT "+ident+".forget_subject('ann')"); err != nil {
		t.Errorf("the writer forgets a subject once restricted: %v", err)
	}
	if err := mayLock(t, runner, "SELECT pg_try_advisory_lock(11, 12)"); err != nil {
		t.Errorf("the runner the deployer granted, once restricted: %v", err)
	}

	// The deployer grants again at the next deploy: no superuser needed.
	for _, g := range []struct {
		r *role
		k migrations.RoleKind
	}{{writer, migrations.Writer}, {runner, migrations.Runner}} {
		if err := migrations.Grant(ctx, deployer.Pool, g.r.Name, g.k, cfg); err != nil {
			t.Errorf("the deployer grants %s again once restricted: %v", g.k, err)
		}
	}
	// A new writer's first grant needs no superuser; a new runner's does.
	if err := migrations.Grant(ctx, deployer.Pool, newWriter.Name, migrations.Writer, cfg); err != nil {
		t.Errorf("the deployer grants a new writer once restricted: %v", err)
	}
	if err := migrations.Grant(ctx, deployer.Pool, newRunner.Name, migrations.Runner, cfg); !errors.Is(err, migrations.ErrNotSuperuser) {
		t.Fatalf("the deployer grants a new runner once restricted: %v, want ErrNotSuperuser", err)
	}
	if _, err := newRunner.Pool.Exec(ctx, "SELECT 1 FROM "+ident+".checkpoints"); err == nil {
		t.Fatal("a refused grant left the role able to read checkpoints: the grant was not undone")
	}
	if err := migrations.Grant(ctx, deployer.Pool, "annals_no_such_role", migrations.Runner, cfg); !errors.Is(err, migrations.ErrRoleNotFound) {
		t.Errorf("the deployer grants a missing role once restricted: %v, want ErrRoleNotFound", err)
	}
	if err := migrations.Grant(ctx, db.Pool, newRunner.Name, migrations.Runner, cfg); err != nil {
		t.Fatalf("a superuser grants the new runner: %v", err)
	}
	if err := mayLock(t, newRunner, "SELECT pg_try_advisory_lock(11, 12)"); err != nil {
		t.Errorf("a runner a superuser granted after the restriction: %v", err)
	}
	if _, err := migrations.Up(ctx, deployer.Pool, cfg); err != nil {
		t.Errorf("migrate again once restricted: %v", err)
	}

	// A role named with --owner migrates a new schema; one not named cannot
	// take the migration lock, and is told what to do.
	for _, r := range []*role{future, unnamed} {
		s := "future_" + r.Name[len(r.Name)-6:]
		t.Cleanup(func() {
			_, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		})
		_, err := migrations.Up(ctx, r.Pool, &migrations.Config{Schema: s})
		switch {
		case r == future && err != nil:
			t.Errorf("the role named as an owner migrates a new schema: %v", err)
		case r == unnamed && !errors.Is(err, migrations.ErrNotSuperuser):
			t.Errorf("a role not named migrates a new schema: %v, want ErrNotSuperuser", err)
		}
	}
}
