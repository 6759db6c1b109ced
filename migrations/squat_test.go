package migrations_test

import (
	"context"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

// TestUpRefusesASchemaAnotherRoleOwns: Up creates the schema IF NOT
// EXISTS, so a role that may create schemas in the database (a runner
// doing blue/green read models is told to have CREATE on it) could make the
// schema before the first 'annals migrate' and grant the owner CREATE on
// it: an audit had the owner migrate into it, and the squatter, owning the
// schema, then drop the log's tables (and could put functions of its own in
// their place). Up refuses to make a new log in a schema owned by another
// role than its own (or a role it is a member of, or a superuser), and
// leaves nothing in it.
func TestUpRefusesASchemaAnotherRoleOwns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	owner := newRole(t, db, "")
	squatter := newRole(t, db, "")
	exec := func(sql string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("GRANT CREATE ON DATABASE " + pgx.Identifier{db.Name}.Sanitize() + " TO " + pgx.Identifier{owner.Name}.Sanitize())
	tables := func(schema string) int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1`, schema).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The squatter's schema, open to the owner: refused, as the owner and
	// as a superuser.
	exec(`CREATE SCHEMA squatted AUTHORIZATION ` + pgx.Identifier{squatter.Name}.Sanitize())
	exec(`GRANT USAGE, CREATE ON SCHEMA squatted TO ` + pgx.Identifier{owner.Name}.Sanitize())
	for who, pool := range map[string]*pgxpool.Pool{"owner": owner.Pool, "superuser": db.Pool} {
		done, err := migrations.Up(ctx, pool, &migrations.Config{Schema: "squatted"})
		if !errors.Is(err, migrations.ErrSchemaOwnedByAnother) || len(done) != 0 {
			t.Errorf("Up as the %s into a schema another role owns: %d applied, %v; want ErrSchemaOwnedByAnother", who, len(done), err)
		}
		t.Logf("as the %s: %v", who, err)
		if n := tables("squatted"); n != 0 {
			t.Errorf("after the refused Up as the %s: %d relations in the schema, want none", who, n)
		}
	}

	// A schema made beforehand for the owner, or by a superuser, is fine.
	exec(`CREATE SCHEMA premade AUTHORIZATION ` + pgx.Identifier{owner.Name}.Sanitize())
	exec(`CREATE SCHEMA by_dba`)
	exec(`GRANT USAGE, CREATE ON SCHEMA by_dba TO ` + pgx.Identifier{owner.Name}.Sanitize())
	for _, schema := range []string{"premade", "by_dba", "fresh"} {
		if done, err := migrations.Up(ctx, owner.Pool, &migrations.Config{Schema: schema}); err != nil || len(done) == 0 {
			t.Errorf("Up as the owner into %s: %d applied, %v", schema, len(done), err)
		}
	}
	// PostgreSQL 15's public schema belongs to pg_database_owner, whose one
	// member is the database's owner (who may drop the database whole).
	if done, err := migrations.Up(ctx, db.Pool, &migrations.Config{Schema: "public"}); err != nil || len(done) == 0 {
		t.Errorf("Up as the superuser into public (owned by pg_database_owner): %d applied, %v", len(done), err)
	}
}

// TestUpRefusesASquattedSchemaWithARecord: the squatter of
// TestUpRefusesASchemaAnotherRoleOwns also makes schema_migrations in its
// schema, with one row of a version annals has not (9999), and lets the
// owner write it. Up judged the schema's owner only when schema_migrations
// was empty, so it took the schema for an existing log, applied every
// migration into it, and the squatter could drop the log (a review). The
// owner is judged while migration 1 (the log's tables) is to be applied.
func TestUpRefusesASquattedSchemaWithARecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	owner := newRole(t, db, "")
	squatter := newRole(t, db, "")
	sq, ow := pgx.Identifier{squatter.Name}.Sanitize(), pgx.Identifier{owner.Name}.Sanitize()
	for _, s := range []string{
		`CREATE SCHEMA squatted AUTHORIZATION ` + sq,
		`CREATE TABLE squatted.schema_migrations (version integer NOT NULL PRIMARY KEY, name text NOT NULL,
		   applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		`INSERT INTO squatted.schema_migrations (version, name) VALUES (9999, 'nothing')`,
		`ALTER TABLE squatted.schema_migrations OWNER TO ` + sq,
		`GRANT USAGE, CREATE ON SCHEMA squatted TO ` + ow,
		`GRANT SELECT, INSERT ON squatted.schema_migrations TO ` + ow,
		`GRANT CREATE ON DATABASE ` + pgx.Identifier{db.Name}.Sanitize() + ` TO ` + ow,
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	for _, who := range []string{"owner", "superuser"} {
		pool := map[string]*pgxpool.Pool{"owner": owner.Pool, "superuser": db.Pool}[who]
		done, err := migrations.Up(ctx, pool, &migrations.Config{Schema: "squatted"})
		if !errors.Is(err, migrations.ErrSchemaOwnedByAnother) || len(done) != 0 {
			t.Errorf("Up as the %s into a schema another role owns, with a record: %d applied, %v; want ErrSchemaOwnedByAnother", who, len(done), err)
		}
		t.Logf("as the %s: %v", who, err)
	}
}
