package verify

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/migrations"
)

var update = flag.Bool("update", false, "write functions.json from a freshly migrated schema")

// manifestOf returns the manifest of the functions of db's schema.
func manifestOf(t *testing.T, db *annalstest.DB) *manifest {
	t.Helper()
	ctx := context.Background()
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(db.Schema))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	m := &manifest{}
	if err := tx.QueryRow(ctx, q["SchemaVersion"]).Scan(&m.Version); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, q["ServerMajor"]).Scan(&m.ServerMajor); err != nil {
		t.Fatal(err)
	}
	if m.Functions, err = readFunctions(ctx, tx, q, db.Schema); err != nil {
		t.Fatal(err)
	}
	if len(m.Functions) < 20 {
		t.Fatalf("%d functions in schema %s", len(m.Functions), db.Schema)
	}
	return m
}

// TestFunctionsManifest: functions.json is what the migrations make, for
// schemas of any name (the default and one that needs quoting give the
// same). After a migration that adds or changes a function:
//
//	go test ./verify -run TestFunctionsManifest -update
func TestFunctionsManifest(t *testing.T) {
	t.Parallel()
	plain := manifestOf(t, annalstest.NewDB(t, nil))
	quoted := manifestOf(t, annalstest.NewDB(t, &annalstest.Options{Schema: `Verify "V" f`}))
	a, err := json.MarshalIndent(plain, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(quoted, "", "  ")
	if string(a) != string(b) {
		t.Fatalf("the functions of schemas annals and %q differ after normalizing:\n%s\n%s", `Verify "V" f`, a, b)
	}
	if *update {
		if err := os.WriteFile("functions.json", append(a, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := loadManifest()
	if err != nil {
		t.Fatal(err)
	}
	c, _ := json.MarshalIndent(got, "", "  ")
	if string(a) != string(c) {
		t.Fatalf("verify/functions.json is not what the migrations make (a migration added or changed a function): "+
			"run 'go test ./verify -run TestFunctionsManifest -update' and commit it\nwant %s\nhave %s", a, c)
	}
}

// TestFunctionsReplaced: the owner replaces the function of the append-only
// trigger with one that lets every change through (the trigger stays, and
// enabled, so the catalog's trigger check sees nothing), changes an event,
// and takes the pinned search_path from an append function. An audit found
// both unreported; each is reported now, and a clean schema reports none.
func TestFunctionsReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	schema := pgx.Identifier{db.Schema}.Sanitize()
	run := func() *Report {
		t.Helper()
		rep, err := Log(ctx, db.Pool, &Config{Schema: db.Schema})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	if rep := run(); !rep.OK() || !rep.Complete() {
		t.Fatalf("a clean schema: %+v", rep)
	}
	for _, s := range []string{
		`CREATE OR REPLACE FUNCTION ` + schema + `.events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`,
		`ALTER FUNCTION ` + schema + `.append_one(text, bigint, uuid, text, text, text, boolean) RESET search_path`,
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	rep := run()
	var msgs []string
	for _, p := range rep.Problems {
		msgs = append(msgs, string(p.Kind)+": "+p.Message)
	}
	all := strings.Join(msgs, "\n")
	if rep.ProblemCount != 2 || !strings.Contains(all, "events_append_only() has a body other than annals' own") ||
		!strings.Contains(all, "append_one(") || !strings.Contains(all, "settings") {
		t.Fatalf("%d problems, want the two functions changed:\n%s", rep.ProblemCount, all)
	}
	t.Log(all)
}

// TestFunctionsOfSchemasOfAnyName: the functions of a schema whose name is
// also an alias, a table or a word of annals' function bodies ("e" in
// events e, e.stream_id; "s", "x", "events") compare as those of any
// other: a trial of plain names found a fresh schema named e with seven
// functions reported replaced, s and x eight, events one, since the name
// written bare (as pg_get_functiondef names a plain schema) was taken out
// of every body wherever it stood.
func TestFunctionsOfSchemasOfAnyName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	for _, schema := range []string{"a", "e", "g", "r", "s", "t", "x", "ev", "events", "streams", "select", "personal", "E'x'"} {
		if _, err := migrations.Up(ctx, db.Pool, &migrations.Config{Schema: schema}); err != nil {
			t.Fatalf("%s: %v", schema, err)
		}
		rep, err := Log(ctx, db.Pool, &Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK() || !rep.Complete() {
			var msgs []string
			for _, p := range rep.Problems {
				msgs = append(msgs, p.Message[:min(len(p.Message), 120)])
			}
			t.Errorf("a fresh schema %q: %d problems %q, notes %q", schema, rep.ProblemCount, msgs, rep.Notes)
		}
	}
}

// TestFunctionsDeparsedByAnotherServer: functions with SQL-standard bodies
// are compared as PostgreSQL prints them, and functions.json was printed by
// PostgreSQL 15. On a server of another major version such a body that
// differs is not reported as replaced (it may be the same function printed
// otherwise) but named in a note of cause NoteServer; a replaced
// PL/pgSQL body is still a problem there. The other server is pretended:
// the reference is loaded with another ServerMajor (not parallel: it swaps
// the embedded reference for its run).
func TestFunctionsDeparsedByAnotherServer(t *testing.T) {
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	schema := pgx.Identifier{db.Schema}.Sanitize()
	for _, s := range []string{
		`CREATE OR REPLACE FUNCTION ` + schema + `.stream_partition(p_stream_id text, p_partitions integer) RETURNS integer
		   LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE RETURN 0`,
		`CREATE OR REPLACE FUNCTION ` + schema + `.events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`,
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	messages := func(rep *Report) string {
		var msgs []string
		for _, p := range rep.Problems {
			msgs = append(msgs, p.Message)
		}
		return strings.Join(msgs, "\n")
	}
	// On the reference's own server both are replaced.
	rep, err := Log(ctx, db.Pool, &Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if all := messages(rep); rep.ProblemCount != 2 || !strings.Contains(all, "stream_partition(") || rep.Skipped(NoteServer) != 0 {
		t.Fatalf("on the reference's server: %d problems, %d server notes, want both functions reported:\n%s", rep.ProblemCount, rep.Skipped(NoteServer), all)
	}

	m, err := loadManifest()
	if err != nil {
		t.Fatal(err)
	}
	m.ServerMajor--
	other, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	saved := functionsJSON
	functionsJSON = other
	defer func() { functionsJSON = saved }()
	rep, err = Log(ctx, db.Pool, &Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	all := messages(rep)
	if rep.ProblemCount != 1 || !strings.Contains(all, "events_append_only()") || strings.Contains(all, "stream_partition(") {
		t.Fatalf("on another server: %d problems, want only events_append_only():\n%s", rep.ProblemCount, all)
	}
	if rep.Skipped(NoteServer) != 1 || !strings.Contains(strings.Join(rep.Notes, "\n"), "stream_partition(") {
		t.Fatalf("on another server: notes %q (causes %v), want one of cause server naming stream_partition", rep.Notes, rep.NoteCauses)
	}
	t.Logf("%s\n%s", all, strings.Join(rep.Notes, "\n"))
}

// TestFunctionsOverloaded: the owner adds to an annals function an overload
// whose parameters are of their categories' preferred types (text for the
// uuid, double precision for the bigint). The eventstore calls append_one
// with parameters the server types, and PostgreSQL then prefers the
// overload, so every single-event
// append ran the owner's code, which stored other data, while each of
// annals' own functions was unchanged and verify reported nothing (a
// review). An overload of an annals function's name is reported.
func TestFunctionsOverloaded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	schema := pgx.Identifier{db.Schema}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `CREATE FUNCTION `+schema+`.append_one(p_stream text, p_expected double precision, p_id text, p_type text,
	      p_data text, p_metadata text, p_check_id boolean,
	      OUT status smallint, OUT global_sequence bigint, OUT stream_version bigint, OUT actual_version bigint)
	    LANGUAGE sql AS $$ SELECT * FROM `+schema+`.append_one(p_stream, p_expected::bigint, p_id::uuid, p_type,
	      '{"forged": true}', p_metadata, p_check_id) $$`); err != nil {
		t.Fatal(err)
	}
	// A function of the user's own that only shares a name (a log in
	// public, say): no call of annals' archive, with three arguments,
	// can run it, and it is not reported.
	if _, err := db.Pool.Exec(ctx, `CREATE FUNCTION `+schema+`.archive(p_what text) RETURNS text LANGUAGE sql AS $$ SELECT p_what $$`); err != nil {
		t.Fatal(err)
	}
	// The append path's own statement, with the Go types it sends, now
	// runs the overload.
	expected := int64(0)
	var data string
	var status int16
	if err := db.Pool.QueryRow(ctx, `SELECT status FROM `+schema+`.append_one($1, $2, $3, $4, $5, $6, $7)`,
		"s-1", &expected, pgtype.UUID{Bytes: [16]byte{1, 2, 3}, Valid: true}, "T", []byte(`{"a": 1}`), []byte(`{}`), true).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT data::text FROM `+schema+`.events WHERE stream_id = 's-1'`).Scan(&data); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(data, "forged") {
		t.Fatalf("the overload did not run (data %s): the test does not show the attack", data)
	}
	rep, err := Log(ctx, db.Pool, &Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, p := range rep.Problems {
		msgs = append(msgs, string(p.Kind)+": "+p.Message)
	}
	all := strings.Join(msgs, "\n")
	if rep.ProblemCount != 1 || !strings.Contains(all, "append_one(p_stream text, p_expected double precision") || !strings.Contains(all, "overload") {
		t.Fatalf("%d problems, want the overload of append_one:\n%s", rep.ProblemCount, all)
	}
	t.Log(all)
}

// TestFunctionsMadeStrict: the owner declares check_event_input STRICT
// (ALTER FUNCTION, body unchanged): called with a NULL expected version,
// an append of any version, it then returns NULL without running, and the
// input rules it raises on (a stream ID with a control character, longer
// than 512 bytes) let such appends through. A PL/pgSQL function's compared
// body is its source, which the declaration is not part of, and verify
// said ok (a review). Whether a function is strict, and its volatility,
// are compared.
func TestFunctionsMadeStrict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	schema := pgx.Identifier{db.Schema}.Sanitize()
	appendBad := `SELECT count(*) FROM ` + schema + `.append_events(E'a\x01b', NULL, '[{"type": "T", "data": {}}]')`
	if _, err := db.Pool.Exec(ctx, appendBad); err == nil {
		t.Fatal("a stream ID with a control character was appended by annals' own functions")
	}
	for _, s := range []string{
		`ALTER FUNCTION ` + schema + `.check_event_input(text, bigint, jsonb) STRICT`,
		`ALTER FUNCTION ` + schema + `.metadata_keys_ok(jsonb) VOLATILE`,
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if _, err := db.Pool.Exec(ctx, appendBad); err != nil {
		t.Fatalf("the strict check_event_input still refused: the test does not show the attack: %v", err)
	}
	rep, err := Log(ctx, db.Pool, &Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, p := range rep.Problems {
		msgs = append(msgs, string(p.Kind)+": "+p.Message)
	}
	all := strings.Join(msgs, "\n")
	if !strings.Contains(all, "check_event_input(p_stream_id text, p_expected_version bigint, p_events jsonb) is strict") ||
		!strings.Contains(all, "metadata_keys_ok(p_md jsonb) is volatile, not immutable") {
		t.Fatalf("%d problems, want check_event_input strict and metadata_keys_ok volatile:\n%s", rep.ProblemCount, all)
	}
	t.Log(all)
}
