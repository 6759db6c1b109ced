package verify

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/migrations"
)

// migrateHistoric makes schema in db as a build of annals whose migration
// file (testdata/historic/NNNN_name.REV.sql, the file at commit REV) was
// later edited in place made it: the migrations before it as they are, that
// file as it was, then the rest by Up, as the current binary upgrades it.
func migrateHistoric(t *testing.T, db *annalstest.DB, schema, file string) {
	t.Helper()
	ctx := context.Background()
	base := filepath.Base(file)
	version, err := strconv.Atoi(base[:4])
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	old, err := sqltmpl.Render(base, string(src), sqltmpl.NewData(schema))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := migrations.All(&migrations.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ms[version-1].SQL = "SET LOCAL search_path = pg_catalog, pg_temp;\n" + old
	id := pgx.Identifier{schema}.Sanitize()
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+id+"; CREATE TABLE "+id+".schema_migrations (version integer NOT NULL PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"); err != nil {
			return err
		}
		for _, m := range ms[:version] {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+id+".schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("%s: %v", base, err)
	}
	if _, err := migrations.Up(ctx, db.Pool, &migrations.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
}

// TestHistoricFunctionBodies: a schema first migrated by a build whose
// migration was edited in place afterwards (0032 at 7d2ed4d and 433cd15,
// 0035 at 62d5044, each on the main branch for up to 80 minutes) keeps
// that build's bodies after the upgrade, since Up does not apply a
// migration again. They are annals' own: verify reported each as
// guard_removed, telling an auditor the log's guards were tampered with.
// A change to such a body is still reported.
func TestHistoricFunctionBodies(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/historic/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatal(files, err)
	}
	db := annalstest.NewDB(t, nil)
	ctx := context.Background()
	for i, file := range files {
		// A plain name and one that needs quoting.
		for _, schema := range []string{"hist_" + strconv.Itoa(i), "Annals-Test " + strconv.Itoa(i)} {
			migrateHistoric(t, db, schema, file)
			rep, err := Log(ctx, db.Pool, &Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			if !rep.OK() || !rep.Complete() {
				t.Errorf("%s in schema %q: %d problems %+v, notes %q", filepath.Base(file), schema, rep.ProblemCount, rep.Problems, rep.Notes)
			}
		}
	}
	// A function of the first historic schema changed: reported (its
	// event_input_bad is 0045's, which every upgrade makes; the set's
	// accepted append_batch_refuse does not hide another change).
	schema := "hist_0"
	if !strings.Contains(files[0], "0032") {
		t.Fatalf("testdata/historic: %s first", files[0])
	}
	if _, err := db.Pool.Exec(ctx, `CREATE OR REPLACE FUNCTION `+schema+`.event_input_bad(p_type text, p_data text, p_metadata text) RETURNS boolean LANGUAGE sql IMMUTABLE RETURN false`); err != nil {
		t.Fatal(err)
	}
	rep, err := Log(ctx, db.Pool, &Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if rep.ProblemCount != 1 || !strings.Contains(rep.Problems[0].Message, "event_input_bad") {
		t.Fatalf("event_input_bad replaced in a historic schema: %+v", rep.Problems)
	}
}
