package migrations_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

// plantedSQL is what a role that may create objects in public (every role
// on PostgreSQL 14 and older, which annals supports, unless the DBA revoked
// it) plants there before the schema's owner runs annals migrate or annals
// grant: functions, operators and an aggregate that match some call of
// annals' SQL more closely than pg_catalog's own (div and mod of numeric and
// integer, where pg_catalog has numeric and numeric; & and % of bigint and
// integer, where it has bigint and bigint; the advisory-lock functions of float8, the preferred
// type of the numeric category, which wins for parameters sent untyped;
// and array_agg of name, where pg_catalog's is polymorphic), each recording
// who ran it.
const plantedSQL = `
CREATE TABLE public.loot (who text NOT NULL, what text NOT NULL);
GRANT INSERT, SELECT ON public.loot TO PUBLIC;
CREATE FUNCTION public.div(a numeric, b integer) RETURNS numeric LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.loot VALUES (current_user, 'div');
    RETURN pg_catalog.div(a, b::numeric);
END $$;
CREATE FUNCTION public.mod(a numeric, b integer) RETURNS numeric LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.loot VALUES (current_user, 'mod');
    RETURN pg_catalog.mod(a, b::numeric);
END $$;
CREATE FUNCTION public.band(a bigint, b integer) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.loot VALUES (current_user, '&');
    RETURN a OPERATOR(pg_catalog.&) b::bigint;
END $$;
CREATE OPERATOR public.& (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = public.band);
CREATE FUNCTION public.bmod(a bigint, b integer) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.loot VALUES (current_user, '%');
    RETURN a OPERATOR(pg_catalog.%) b::bigint;
END $$;
CREATE OPERATOR public.% (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = public.bmod);
CREATE FUNCTION public.aa_name(s name[], v name) RETURNS name[] LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.loot VALUES (current_user, 'array_agg');
    RETURN s OPERATOR(pg_catalog.||) v;
END $$;
CREATE AGGREGATE public.array_agg(name) (SFUNC = public.aa_name, STYPE = name[]);
CREATE FUNCTION public.pg_advisory_lock(a float8, b float8) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.loot VALUES (current_user, 'pg_advisory_lock');
    PERFORM pg_catalog.pg_advisory_lock(a::int, b::int);
END $$;
CREATE FUNCTION public.pg_advisory_unlock(a float8, b float8) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.loot VALUES (current_user, 'pg_advisory_unlock');
    RETURN pg_catalog.pg_advisory_unlock(a::int, b::int);
END $$;
CREATE FUNCTION public.pg_advisory_xact_lock(a float8, b float8) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.loot VALUES (current_user, 'pg_advisory_xact_lock');
    PERFORM pg_catalog.pg_advisory_xact_lock(a::int, b::int);
END $$;
`

// TestMigrateAndGrantBindNothingFromTheSearchPath: annals migrate and annals
// grant run as the schema's owner (often a superuser), with whatever
// search_path the session has ("$user", public by default). An unqualified
// name that a planted object matches better than pg_catalog's resolves to
// the planted one: in a function whose body is parsed at CREATE
// (max_age_fixed, stream_partition: LANGUAGE sql with a RETURN body) it
// stays bound for good, and set_stream_retention, SECURITY DEFINER, then
// ran the planter's code as the schema's owner at every call by a writer;
// in the statements Up and Grant send themselves (the migration and grant
// locks, parameters untyped) it ran as the owner at once. Nothing of the
// migrated schema may depend on an object of public, and no planted
// function may run as the owner.
func TestMigrateAndGrantBindNothingFromTheSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := plantedDB(t)
	const schema = `planted "S"`
	dropAtEnd(t, db, schema)
	cfg := &migrations.Config{Schema: schema}
	if _, err := migrations.Up(ctx, db.Pool, cfg); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	w := newRole(t, db, "")
	if err := migrations.Grant(ctx, db.Pool, w.Name, migrations.Writer, cfg); err != nil {
		t.Fatalf("grant: %v", err)
	}
	// annals advisory-locks status, run by a superuser (array_agg of role
	// names, a runner's among them: pg_catalog's is polymorphic, the
	// planted one exact).
	run := newRole(t, db, "")
	if err := migrations.Grant(ctx, db.Pool, run.Name, migrations.Runner, cfg); err != nil {
		t.Fatalf("grant: %v", err)
	}
	if _, err := migrations.AdvisoryLocks(ctx, db.Pool); err != nil {
		t.Fatalf("advisory-locks status: %v", err)
	}
	noPlantedCode(t, db, schema, w)
}

// TestMigrationRebindsPlantedFunctions: a schema migrated (up to 0041)
// before Up pinned the search_path, under the one a planter counted on,
// has its functions bound to the planted objects; the next annals migrate
// (0042) binds them to pg_catalog.
func TestMigrationRebindsPlantedFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := plantedDB(t)
	const schema = `planted "old"`
	dropAtEnd(t, db, schema)
	ms, err := migrations.All(&migrations.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	at := slices.IndexFunc(ms, func(m migrations.Migration) bool { return m.Version == 42 })
	if at < 0 {
		t.Fatal("no migration 0042")
	}
	// What Up did before 0042's release: each migration under the
	// session's search_path, recorded as applied.
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %[1]s;
		CREATE TABLE %[1]s.schema_migrations (version integer NOT NULL PRIMARY KEY, name text NOT NULL,
		                                      applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`, ident)); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms[:at] {
		// Without the pin All adds now (TestAllPinsTheSearchPathOfEachMigration).
		if _, err := db.Pool.Exec(ctx, strings.TrimPrefix(m.SQL, "SET LOCAL search_path = pg_catalog, pg_temp;\n")); err != nil {
			t.Fatalf("%04d_%s: %v", m.Version, m.Name, err)
		}
		if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.schema_migrations (version, name) VALUES ($1, $2)`, ident), m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
	}
	if len(dependsOnPublic(t, db)) == 0 {
		t.Fatal("control: migrated as before, nothing depends on the planted objects; the test proves nothing")
	}
	if _, err := migrations.Up(ctx, db.Pool, &migrations.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	w := newRole(t, db, "")
	if err := migrations.Grant(ctx, db.Pool, w.Name, migrations.Writer, &migrations.Config{Schema: schema}); err != nil {
		t.Fatalf("grant: %v", err)
	}
	noPlantedCode(t, db, schema, w)
}

// plantedDB returns a database in whose public schema a role other than the
// test's (the owner's) planted plantedSQL, as PostgreSQL 14 and older let
// every role do.
func plantedDB(t *testing.T) *annalstest.DB {
	t.Helper()
	db := annalstest.NewDB(t, nil)
	mallory := newRole(t, db, "")
	if _, err := db.Pool.Exec(context.Background(), "GRANT CREATE ON SCHEMA public TO "+pgx.Identifier{mallory.Name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := mallory.Pool.Exec(context.Background(), plantedSQL); err != nil {
		t.Fatal(err)
	}
	return db
}

// dropAtEnd drops schema when the test ends, before the roles' cleanups
// (registered earlier, run later), whose DROP OWNED BY the schema's
// functions would block if they depend on the planted ones.
func dropAtEnd(t *testing.T, db *annalstest.DB, schema string) {
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
}

// dependsOnPublic lists what depends on a function or operator of public,
// the planted objects' dependencies on each other aside.
func dependsOnPublic(t *testing.T, db *annalstest.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
		SELECT pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) || ' uses ' ||
		       pg_catalog.pg_describe_object(d.refclassid, d.refobjid, 0)
		  FROM pg_catalog.pg_depend d
		 WHERE NOT (d.classid = 'pg_catalog.pg_operator'::regclass
		            AND d.objid IN (SELECT o.oid FROM pg_catalog.pg_operator o WHERE o.oprnamespace = 'public'::regnamespace))
		   AND NOT (d.classid = 'pg_catalog.pg_proc'::regclass
		            AND d.objid IN (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'public'::regnamespace))
		   AND ((d.refclassid = 'pg_catalog.pg_proc'::regclass
		        AND d.refobjid IN (SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'public'::regnamespace))
		    OR (d.refclassid = 'pg_catalog.pg_operator'::regclass
		        AND d.refobjid IN (SELECT o.oid FROM pg_catalog.pg_operator o WHERE o.oprnamespace = 'public'::regnamespace)))
		 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	bound, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return bound
}

// noPlantedCode fails t if anything depends on the planted objects, or if
// one of them ran (in the migration, the grant, or the writer w's calls of
// the schema's functions).
func noPlantedCode(t *testing.T, db *annalstest.DB, schema string, w *role) {
	t.Helper()
	ctx := context.Background()
	ident := pgx.Identifier{schema}.Sanitize()
	var owner, path string
	if err := db.Pool.QueryRow(ctx, "SELECT current_user, current_setting('search_path')").Scan(&owner, &path); err != nil {
		t.Fatal(err)
	}
	for _, b := range dependsOnPublic(t, db) {
		t.Errorf("migrated with search_path %q: %s", path, b)
	}
	// A writer's calls, and a reader's partition.
	for _, q := range []string{
		fmt.Sprintf(`SELECT * FROM %s.append_events_json('s', 0, '[{"type": "T", "data": {}}]')`, ident),
		fmt.Sprintf(`SELECT * FROM %s.set_stream_retention('s', '1 day 0.5 seconds', NULL, NULL)`, ident),
		fmt.Sprintf(`SELECT %s.stream_partition('s', 4)`, ident),
	} {
		if _, err := w.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// The functions give what they gave before: stream_partition's value
	// is part of the partition layout (walsource computes it in Go too).
	var part int
	var age string
	if err := w.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT %[1]s.stream_partition('order-42', 7), %[1]s.max_age_fixed('1 mon 2 days 03:04:05.25')::text`, ident)).Scan(&part, &age); err != nil {
		t.Fatal(err)
	}
	if part != 5 || age != "771:04:05.25" {
		t.Errorf("stream_partition('order-42', 7) = %d, max_age_fixed('1 mon 2 days 03:04:05.25') = %s; want 5 and 771:04:05.25", part, age)
	}
	rows, err := db.Pool.Query(ctx, `SELECT who || ' ran public.' || what FROM public.loot ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	ran, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ran {
		t.Errorf("a planted function ran (the owner is %s, the writer %s): %s", owner, w.Name, r)
	}
}

// Each migration All returns (for other tools: docs/operations.md) pins the
// search_path of the transaction it runs in, and only that transaction's:
// applied one by one on a session whose path starts with a schema that
// plants div(numeric, integer), none binds to it, and the session keeps
// its path afterwards.
func TestAllPinsTheSearchPathOfEachMigration(t *testing.T) {
	t.Parallel()
	ms, err := migrations.All(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if !strings.HasPrefix(m.SQL, "SET LOCAL search_path = pg_catalog, pg_temp;\n") {
			t.Fatalf("migration %04d does not start with the pin: %.80q", m.Version, m.SQL)
		}
	}
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `CREATE SCHEMA planted;
		CREATE FUNCTION planted.div(numeric, integer) RETURNS numeric LANGUAGE sql AS 'SELECT 0::numeric';
		SET search_path = planted, public`); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.Background(), "RESET search_path")
	// A schema of its own, migrated as a tool would: each migration in a
	// transaction of its own on this session.
	cfg := &migrations.Config{Schema: "tool_applied"}
	ms, err = migrations.All(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE SCHEMA tool_applied`); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("migration %04d: %v", m.Version, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var path string
	if err := conn.QueryRow(ctx, "SHOW search_path").Scan(&path); err != nil || path != "planted, public" {
		t.Fatalf("the session's search_path after the migrations: %q, %v", path, err)
	}
	var deps int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_depend d JOIN pg_proc p ON p.oid = d.refobjid
		JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'planted'`).Scan(&deps); err != nil || deps != 0 {
		t.Fatalf("%d objects depend on the planted function (%v)", deps, err)
	}
}
