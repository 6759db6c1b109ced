package migrations_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
	// A writer and a runner granted before grant.sql named the lock
	// functions: RestrictAdvisoryLocks finds them by what they may do.
	oldWriter := newRole(t, db, migrations.Writer)
	oldRunner := newRole(t, db, migrations.Runner)
	for _, r := range []*role{oldWriter, oldRunner} {
		if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`REVOKE EXECUTE ON FUNCTION pg_catalog.pg_advisory_xact_lock(integer, integer),
			pg_catalog.pg_try_advisory_xact_lock_shared(bigint), pg_catalog.pg_try_advisory_lock(integer, integer),
			pg_catalog.pg_advisory_lock(integer, integer), pg_catalog.pg_try_advisory_xact_lock_shared(integer, integer) FROM %s`,
			pgx.Identifier{r.Name}.Sanitize())); err != nil {
			t.Fatal(err)
		}
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
	a := restrictAdvisoryLocks(t, db)
	for _, want := range []struct {
		list  []string
		roles []*role
		what  string
	}{
		{a.Writers, []*role{writer, runner, operator, oldWriter, oldRunner}, "writers"},
		{a.Runners, []*role{runner, operator, oldRunner}, "runners"},
		{a.Roles, []*role{writer, runner, operator, oldWriter, oldRunner}, "roles granted lock functions"},
	} {
		for _, r := range want.roles {
			if !slices.Contains(want.list, r.Name) {
				t.Errorf("%s %v lack %s", want.what, want.list, r.Name)
			}
		}
		for _, r := range []*role{reader, stranger} {
			if slices.Contains(want.list, r.Name) {
				t.Errorf("%s %v hold %s", want.what, want.list, r.Name)
			}
		}
	}
	again, err := migrations.RestrictAdvisoryLocks(ctx, db.Pool)
	if err != nil || !again.Restricted || !slices.Equal(again.Roles, a.Roles) {
		t.Fatalf("restricting again: %+v, %v; want the same as %+v", again, err, a)
	}

	// A role that may merely connect, and a reader, take no lock at all.
	for _, r := range []*role{stranger, reader} {
		for _, call := range lockCalls {
			mustDeny(t, r.Name+": "+call, mayLock(t, r, call))
		}
	}
	// A writer takes the transaction locks its statements take (snapshot
	// writes, inline projections), and no session lock: what it holds ends
	// with its transaction.
	for _, w := range []*role{writer, oldWriter} {
		for _, call := range []string{"SELECT pg_try_advisory_xact_lock_shared(11)", "SELECT pg_advisory_xact_lock(11, 12)"} {
			if err := mayLock(t, w, call); err != nil {
				t.Errorf("%s: %s: %v", w.Name, call, err)
			}
		}
		for _, call := range []string{"SELECT pg_advisory_lock(11, 12)", "SELECT pg_try_advisory_lock(11, 12)", "SELECT pg_advisory_lock(11)"} {
			mustDeny(t, w.Name+": "+call, mayLock(t, w, call))
		}
		store, err := eventstore.New(w.Pool, &eventstore.Config{Schema: db.Schema})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Append(ctx, "order-"+w.Name, eventstore.NoStream, eventstore.EventData{Type: "Placed", Data: map[string]int{}}); err != nil {
			t.Errorf("%s appends once restricted: %v", w.Name, err)
		}
	}
	// A runner and an operator take session locks (leader elections).
	for _, r := range []*role{runner, operator, oldRunner} {
		for _, call := range []string{"SELECT pg_try_advisory_lock(11, 12)", "SELECT pg_advisory_lock(11, 12)", "SELECT pg_try_advisory_xact_lock_shared(11, 12)"} {
			if err := mayLock(t, r, call); err != nil {
				t.Errorf("%s: %s: %v", r.Name, call, err)
			}
		}
	}
	// A role granted after the restriction gets its lock functions from
	// Grant.
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

// TestRestrictAdvisoryLocksSchemaOwner: a schema migrated by a role that is
// no superuser. Its append functions run as that role and take the ordering
// lock, so the restriction grants it the lock functions (appends go on). Its
// Grant passes none on: a role's first grant needs a superuser from then on.
func TestRestrictAdvisoryLocksSchemaOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	owner := newRole(t, db, "")
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s",
		pgx.Identifier{db.Name}.Sanitize(), pgx.Identifier{owner.Name}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	schema := "owned_" + owner.Name[len(owner.Name)-6:]
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	cfg := &migrations.Config{Schema: schema}
	if _, err := migrations.Up(ctx, owner.Pool, cfg); err != nil {
		t.Fatalf("migrate as a role that is no superuser: %v", err)
	}
	// Granted by the owner while PUBLIC has the lock functions: the owner
	// has no grant option on them, so Grant leaves them out.
	early := newRole(t, db, "")
	if err := migrations.Grant(ctx, owner.Pool, early.Name, migrations.Writer, cfg); err != nil {
		t.Fatalf("the owner grants writer: %v", err)
	}

	a := restrictAdvisoryLocks(t, db)
	if !slices.Contains(a.Owners, owner.Name) || !slices.Contains(a.Writers, early.Name) {
		t.Fatalf("after the restriction: %+v; want owner %s and writer %s", a, owner.Name, early.Name)
	}
	appendAs := func(p *pgxpool.Pool, stream string) error {
		store, err := eventstore.New(p, &eventstore.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		_, err = store.Append(ctx, stream, eventstore.NoStream, eventstore.EventData{Type: "Placed", Data: map[string]int{}})
		return err
	}
	if err := appendAs(early.Pool, "early"); err != nil {
		t.Fatalf("a writer appends through the owner's function once restricted: %v", err)
	}
	// The owner grants again at the next deploy: the writer has its lock
	// functions (from the restriction), so that needs no superuser.
	if err := migrations.Grant(ctx, owner.Pool, early.Name, migrations.Writer, cfg); err != nil {
		t.Fatalf("the owner grants the writer again once restricted: %v", err)
	}
	// A new role's first grant does: the owner cannot pass the lock
	// functions on.
	late := newRole(t, db, "")
	if err := migrations.Grant(ctx, owner.Pool, late.Name, migrations.Writer, cfg); !errors.Is(err, migrations.ErrNotSuperuser) {
		t.Fatalf("the owner grants a new writer once restricted: %v, want ErrNotSuperuser", err)
	}
	if err := appendAs(late.Pool, "late"); err == nil {
		t.Fatal("a refused grant left the role able to append: the grant was not undone")
	}
	if err := migrations.Grant(ctx, owner.Pool, "annals_no_such_role", migrations.Writer, cfg); !errors.Is(err, migrations.ErrRoleNotFound) {
		t.Errorf("the owner grants a missing role once restricted: %v, want ErrRoleNotFound", err)
	}
	if err := migrations.Grant(ctx, db.Pool, late.Name, migrations.Writer, cfg); err != nil {
		t.Fatalf("a superuser grants the new writer: %v", err)
	}
	if err := mayLock(t, late, "SELECT pg_advisory_xact_lock(11, 12)"); err != nil {
		t.Errorf("a writer a superuser granted after the restriction: %v", err)
	}
	if err := migrations.Grant(ctx, owner.Pool, late.Name, migrations.Writer, cfg); err != nil {
		t.Errorf("the owner grants it again: %v", err)
	}
	// The owner's own session may take the migration lock (Up again).
	if _, err := migrations.Up(ctx, owner.Pool, cfg); err != nil {
		t.Errorf("migrate again once restricted: %v", err)
	}
}
