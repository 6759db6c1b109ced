package verify

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

// TestFunctionsOfASchemaAtAnotherVersion: verify on a schema that is not
// at its migration (an upgrade trial). The SQL of 'annals migrate --print'
// applied by another tool makes annals' own functions but no
// schema_migrations: verify said the role had no SELECT on it (a
// superuser) and compared nothing; it compares them now and says nothing
// when they are annals' own, and names what differs otherwise, as it does
// for a schema at an older or newer migration, saying which and what to
// do. None of these is a problem (an older annals may have made them), and
// each note says why the functions could not be judged (NoteVersion).
func TestFunctionsOfASchemaAtAnotherVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	run := func(schema string) *Report {
		t.Helper()
		rep, err := Log(ctx, db.Pool, &Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK() {
			t.Fatalf("schema %q: problems %+v", schema, rep.Problems)
		}
		return rep
	}
	wantNote := func(rep *Report, parts ...string) {
		t.Helper()
		if len(rep.Notes) != 1 || len(rep.NoteCauses) != 1 || rep.NoteCauses[0] != NoteVersion {
			t.Fatalf("notes %q (%q), want one of cause %q", rep.Notes, rep.NoteCauses, NoteVersion)
		}
		for _, p := range parts {
			if !strings.Contains(rep.Notes[0], p) {
				t.Fatalf("note %q does not say %q", rep.Notes[0], p)
			}
		}
		t.Log(rep.Notes[0])
	}

	// Applied from the script, as another tool would.
	printed := "Annals-Printed"
	script, err := migrations.Script(&migrations.Config{Schema: printed})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, script); err != nil {
		t.Fatal(err)
	}
	if rep := run(printed); !rep.Complete() {
		t.Fatalf("a schema from the script: notes %q", rep.Notes)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE OR REPLACE FUNCTION `+pgx.Identifier{printed}.Sanitize()+`.events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`); err != nil {
		t.Fatal(err)
	}
	wantNote(run(printed), "1 of the schema's functions (events_append_only())", "no schema_migrations", "annals migrate --print")

	// At an older migration (0040: 0041 made set_stream_retention
	// again), then at a newer one than this verify knows.
	older := "annals_40"
	ms, err := migrations.All(&migrations.Config{Schema: older})
	if err != nil {
		t.Fatal(err)
	}
	id := pgx.Identifier{older}.Sanitize()
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+id+"; CREATE TABLE "+id+".schema_migrations (version integer NOT NULL PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"); err != nil {
			return err
		}
		for _, m := range ms[:40] {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+id+".schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	wantNote(run(older), "set_stream_retention(", "at migration 40, older than this annals verify's", "'annals migrate' upgrades it")
	if _, err := migrations.Up(ctx, db.Pool, &migrations.Config{Schema: older}); err != nil {
		t.Fatal(err)
	}
	if rep := run(older); !rep.Complete() {
		t.Fatalf("upgraded: notes %q", rep.Notes)
	}
	m, err := loadManifest()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "INSERT INTO "+id+".schema_migrations (version, name) VALUES ($1, 'from_the_future')", m.Version+1); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "DROP FUNCTION "+id+".stream_partition(text, integer)"); err != nil {
		t.Fatal(err)
	}
	wantNote(run(older), "stream_partition(", "newer than this annals verify's", "verify with the annals that migrated it")
}

// TestVerifyOfASchemaBefore0038: verify of a newer annals on a schema not
// yet migrated to 0038 (an upgrade trial) says what it could not check and
// why, each note with its cause: the functions that differ and the
// deletion records (version: annals migrate), the deletions checked as
// before 0038 (history). It said the deletions were those "above position
// 9223372036854775807, the head when it ran" of a migration not run.
func TestVerifyOfASchemaBefore0038(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	schema := "before_0038"
	ms, err := migrations.All(&migrations.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	id := pgx.Identifier{schema}.Sanitize()
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+id+"; CREATE TABLE "+id+".schema_migrations (version integer NOT NULL PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"); err != nil {
			return err
		}
		for _, m := range ms[:37] {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+id+".schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
				return err
			}
		}
		for _, q := range []string{
			`SELECT * FROM ` + id + `.append_one('a', NULL, gen_random_uuid(), 'T', '{}', NULL, true)`,
			`SELECT * FROM ` + id + `.delete_stream('a', NULL, false)`,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rep, err := Log(ctx, db.Pool, &Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("problems %+v", rep.Problems)
	}
	want := map[NoteCause]int{NoteVersion: 2, NoteHistory: 1}
	for cause, n := range want {
		if got := rep.Skipped(cause); got != n {
			t.Errorf("%d notes of cause %s, want %d: %q %q", got, cause, n, rep.Notes, rep.NoteCauses)
		}
	}
	for _, n := range rep.Notes {
		if strings.Contains(n, "9223372036854775807") {
			t.Errorf("note %q", n)
		}
		t.Log(n)
	}
}
