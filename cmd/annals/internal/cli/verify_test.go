package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

func TestVerifyCommand(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	dir := t.TempDir()
	base := filepath.Join(dir, "log.baseline")
	for _, s := range []string{"a", "b", "a"} {
		if r := annals(t, db.URL, "append", s, "T", `{"x": 1}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	r := annals(t, db.URL, "verify", "--write-baseline", base, "--interval", "2")
	if r.code != 0 || !strings.Contains(r.stdout, "ok: no problems found") || !strings.Contains(r.stdout, "baseline written") {
		t.Fatalf("verify a clean log: %+v", r)
	}
	if _, err := os.Stat(base); err != nil {
		t.Fatal(err)
	}
	if r := annals(t, db.URL, "verify", "--baseline", base, "--write-baseline", base); r.code != 0 {
		t.Fatalf("verify against its own baseline: %+v", r)
	}
	before, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}

	// The owner rewrites an event.
	if _, err := db.Pool.Exec(context.Background(), `ALTER TABLE annals.events DISABLE TRIGGER events_append_only;
		UPDATE annals.events SET data = '{"x": 2}' WHERE global_sequence = 2;
		ALTER TABLE annals.events ENABLE TRIGGER events_append_only`); err != nil {
		t.Fatal(err)
	}
	r = annals(t, db.URL, "verify", "--baseline", base, "--write-baseline", base, "--output", "json")
	if r.code != ExitFailure {
		t.Fatalf("verify a changed log: %+v", r)
	}
	var rep struct {
		OK       bool `json:"ok"`
		Problems []struct {
			Kind     string `json:"kind"`
			After    int64  `json:"after"`
			Position int64  `json:"position"`
		} `json:"problems"`
		ProblemCount int `json:"problem_count"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if rep.OK || rep.ProblemCount != 1 || rep.Problems[0].Kind != "changed" || rep.Problems[0].After != 0 || rep.Problems[0].Position != 2 {
		t.Fatalf("report: %+v", rep)
	}
	if after, _ := os.ReadFile(base); string(after) != string(before) {
		t.Error("the baseline was overwritten although the log has problems")
	}
	// A range from the log's start says so ("after": 0), and the JSON says
	// why the baseline was not written.
	for _, want := range []string{`"after": 0`, `"complete": true`, `"baseline_not_written": "the log has problems"`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("JSON report without %s: %s", want, r.stdout)
		}
	}
	// One problem, in the singular.
	if r = annals(t, db.URL, "verify", "--baseline", base); r.code != ExitFailure || !strings.Contains(r.stdout, "\n1 problem found\n") ||
		!strings.Contains(r.stdout, ": 3 events in 2 streams, head 3") {
		t.Fatalf("verify a changed log, text: %+v", r)
	}

	for _, args := range [][]string{
		{"verify", "--output", "xml"},
		{"verify", "--baseline", filepath.Join(dir, "missing")},
		{"verify", "--interval", "0"},
		{"verify", "extra"},
		{"verify", "--write-baseline", filepath.Join(dir, "no-such-dir", "b")}, // before reading the log
	} {
		if r := annals(t, db.URL, args...); r.code != ExitUsage || strings.Contains(r.stderr, "verify: position") {
			t.Errorf("%v: exit %d, want 2 before any reading: %+v", args, r.code, r)
		}
	}
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := annals(t, db.URL, "verify", "--baseline", garbage); r.code != ExitUsage {
		t.Errorf("a file that is not a baseline: %+v", r)
	}
}

// TestVerifyStrict: a role that cannot make every check (a reader) passes
// with notes, says how many checks it skipped, and fails with --strict.
func TestVerifyStrict(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	if r := annals(t, db.URL, "append", "a", "T", `{"x": 1}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	name, readerURL := loginRole(t, db, "verifier")
	if r := annals(t, db.URL, "grant", "reader", name); r.code != 0 {
		t.Fatalf("grant reader: %+v", r)
	}
	r := annals(t, readerURL, "verify")
	if r.code != 0 || !strings.Contains(r.stdout, "note: ") || !strings.Contains(r.stdout, "ok: no problems found (") ||
		!strings.Contains(r.stdout, " skipped: see the notes)") {
		t.Fatalf("verify as a reader: %+v", r)
	}
	r = annals(t, readerURL, "verify", "--output", "json")
	if r.code != 0 || !strings.Contains(r.stdout, `"complete": false`) || !strings.Contains(r.stdout, `"ok": true`) {
		t.Fatalf("verify as a reader, JSON: %+v", r)
	}
	r = annals(t, readerURL, "verify", "--strict")
	if r.code != ExitFailure || !strings.Contains(r.stderr, "annals: verify --strict: ") {
		t.Fatalf("verify --strict as a reader: %+v", r)
	}
	// The owner makes every check: --strict passes.
	if r := annals(t, db.URL, "verify", "--strict"); r.code != 0 || !strings.Contains(r.stdout, "ok: no problems found\n") {
		t.Fatalf("verify --strict as the owner: %+v", r)
	}
}

// TestVerifyStrictAfterAnUpgrade: an upgrade trial. A log with a deletion
// made before migration 0038 (no deletion record) keeps a note that it was
// checked by the rules before 0038 for good, and --strict failed it, as
// for a role without privileges ("run it as a role with the operator's
// grants"), which no role could change: such a note does not fail
// --strict now. A schema not at the migration verify knows (its record
// of 0043 gone, a function replaced) still fails --strict, saying so and
// what to do.
func TestVerifyStrictAfterAnUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	schema := "upgraded"
	id := pgx.Identifier{schema}.Sanitize()
	ms, err := migrations.All(&migrations.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	// Through 0037, as an annals before 0038 made it, with a deletion.
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
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"append", "a", "T", `{}`}, {"append", "a", "T", `{}`}, {"stream", "delete", "a"}, {"scavenge"}, {"migrate"}} {
		if r := annals(t, db.URL, append([]string{"--schema", schema}, args...)...); r.code != 0 {
			t.Fatalf("%v: %+v", args, r)
		}
	}
	r := annals(t, db.URL, "--schema", schema, "verify", "--strict", "--output", "json")
	if r.code != 0 || !strings.Contains(r.stdout, "without a deletion record") || !strings.Contains(r.stdout, `"history"`) {
		t.Fatalf("verify --strict of a log with a deletion before 0038: %+v", r)
	}

	// Not at the migration verify knows, and a function not this
	// version's.
	if _, err := db.Pool.Exec(ctx, "DELETE FROM "+id+".schema_migrations WHERE version = (SELECT max(version) FROM "+id+".schema_migrations)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE OR REPLACE FUNCTION `+id+`.events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`); err != nil {
		t.Fatal(err)
	}
	r = annals(t, db.URL, "--schema", schema, "verify")
	if r.code != 0 || !strings.Contains(r.stdout, "events_append_only()") || !strings.Contains(r.stdout, "older than this annals verify's") {
		t.Fatalf("verify of a schema at an older migration: %+v", r)
	}
	r = annals(t, db.URL, "--schema", schema, "verify", "--strict")
	if r.code != ExitFailure || !strings.Contains(r.stderr, "the schema is not at the migration this annals verify knows") ||
		!strings.Contains(r.stderr, "annals migrate") || strings.Contains(r.stderr, "operator's grants") {
		t.Fatalf("verify --strict of a schema at an older migration: %+v", r)
	}
	t.Log(r.stderr)
}
