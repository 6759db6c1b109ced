package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/annalstest"
)

type result struct {
	code           int
	stdout, stderr string
}

// annals runs the command line in-process against url (empty: no database).
func annals(t *testing.T, url string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
	code := run(context.Background(), args, strings.NewReader(""), &out, &errOut, getenv)
	return result{code, out.String(), errOut.String()}
}

func TestCLIEndToEnd(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	const schema = `cli "Schema"`

	r := annals(t, db.URL, "migrate", "--schema", schema)
	if r.code != 0 || !strings.Contains(r.stdout, "applied 0001_events") {
		t.Fatalf("migrate: %+v", r)
	}
	if r = annals(t, db.URL, "migrate", "--schema", schema); r.code != 0 || !strings.Contains(r.stdout, "up to date") {
		t.Fatalf("second migrate: %+v", r)
	}
	if r = annals(t, db.URL, "migrate", "--status", "--schema", schema); r.code != 0 || !strings.Contains(r.stdout, "0001  events") || strings.Contains(r.stdout, "pending") {
		t.Fatalf("migrate --status: %+v", r)
	}

	r = annals(t, db.URL, "append", "--schema", schema, "order-1", "order.placed", `{"total": 100}`, "--expected-version", "no-stream",
		"--metadata", `{"correlation_id":"c-1"}`)
	if r.code != 0 || !strings.Contains(r.stdout, "version 1, position 1") {
		t.Fatalf("append: %+v", r)
	}
	if r = annals(t, db.URL, "append", "--schema", schema, "order-1", "order.shipped", `{}`, "--expected-version", "1"); r.code != 0 {
		t.Fatalf("append 2: %+v", r)
	}
	if r = annals(t, db.URL, "append", "--schema", schema, "order-2", "order.placed", `[1,2]`); r.code != 0 {
		t.Fatalf("append 3: %+v", r)
	}

	r = annals(t, db.URL, "read", "--schema", schema)
	if r.code != 0 {
		t.Fatalf("read: %+v", r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "POSITION") || !strings.Contains(lines[1], "order.placed") || !strings.Contains(lines[3], "order-2") {
		t.Fatalf("read table:\n%s", r.stdout)
	}

	r = annals(t, db.URL, "read", "order-1", "--output", "jsonl", "--schema", schema)
	if r.code != 0 {
		t.Fatalf("read jsonl: %+v", r)
	}
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	var objs []map[string]json.RawMessage
	for sc.Scan() {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("jsonl line %q: %v", sc.Text(), err)
		}
		objs = append(objs, m)
	}
	if len(objs) != 2 {
		t.Fatalf("jsonl gave %d lines: %s", len(objs), r.stdout)
	}
	var keys []string
	for k := range objs[0] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	want := []string{"data", "event_id", "event_type", "global_sequence", "metadata", "recorded_at", "stream_id", "stream_version"}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("jsonl keys %v, want %v", keys, want)
	}
	if string(objs[0]["data"]) != `{"total":100}` && string(objs[0]["data"]) != `{"total": 100}` {
		t.Fatalf("data = %s", objs[0]["data"])
	}
	if string(objs[0]["metadata"]) != `{"correlation_id":"c-1"}` || string(objs[1]["metadata"]) != "null" {
		t.Fatalf("metadata = %s, %s", objs[0]["metadata"], objs[1]["metadata"])
	}

	if r = annals(t, db.URL, "read", "--from", "2", "--limit", "1", "--output", "jsonl", "--schema", schema); r.code != 0 ||
		strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, `"global_sequence":2`) {
		t.Fatalf("read --from 2 --limit 1: %+v", r)
	}

	// Failures (not usage mistakes) exit 1.
	r = annals(t, db.URL, "append", "--schema", schema, "order-1", "order.placed", `{}`, "--expected-version", "no-stream")
	if r.code != 1 || !strings.Contains(r.stderr, "wrong expected version") || !strings.Contains(r.stderr, "actual 2") {
		t.Fatalf("conflicting append: %+v", r)
	}
	if r = annals(t, db.URL, "read", "missing", "--schema", schema); r.code != ExitNotFound || !strings.Contains(r.stderr, "stream not found") {
		t.Fatalf("read missing stream: %+v", r)
	}

	// Bad flags and arguments exit 2 and change nothing.
	bad := [][]string{
		{"append", "s", "t"},
		{"append", "s", "t", `{"a":`},
		{"append", "s", "t", `5`},
		{"append", "", "t", `{}`},
		{"append", "s", "", `{}`},
		{"append", "s", "t", `{}`, "--expected-version", "soon"},
		{"append", "s", "t", `{}`, "--expected-version", "-4"},
		{"append", "s", "t", `{}`, "--metadata", `[1]`},
		{"append", "s", "t", `{}`, "--event-id", `x`},
		{"append", "s", "t", `{}`, "--nope"},
		{"read", "--output", "xml"},
		{"read", "--from", "-1"},
		{"read", "--limit", "many"},
		{"read", "a", "b"},
		{"migrate", "extra"},
		{"migrate", "--print", "--status"},
		{"read", "--schema", "bad$schema"},
		{"nosuchcommand"},
		{"dev", "--port", "70000"},
	}
	for _, args := range bad {
		if !strings.Contains(strings.Join(args, " "), "--schema") {
			args = append(args, "--schema", schema)
		}
		r := annals(t, db.URL, args...)
		if r.code != 2 || r.stderr == "" || strings.Contains(r.stderr, "goroutine") || strings.Contains(r.stderr, ".go:") {
			t.Errorf("annals %s: code %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
		}
	}
	if r = annals(t, "", "read"); r.code != 2 || !strings.Contains(r.stderr, "DATABASE_URL") {
		t.Errorf("no database: %+v", r)
	}
	r = annals(t, db.URL, "read", "--output", "jsonl", "--schema", schema)
	if n := strings.Count(r.stdout, "\n"); n != 3 {
		t.Fatalf("bad commands changed the log: %d events now", n)
	}
}

// annals append --output json prints the appended event's ID, position and
// version; the nil UUID is no event ID (exit 2); reusing an ID for other
// content fails (exit 1) with the message's prefix printed once.
func TestAppendOutputAndEventID(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	const id = "0191d6a4-0000-7000-8000-0000000000aa"
	if r := annals(t, db.URL, "append", "order-1", "order.placed", `{}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	r := annals(t, db.URL, "append", "order-1", "order.shipped", `{"n":1}`, "--event-id", id, "--output", "json")
	var out AppendJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil {
		t.Fatalf("append --output json: %+v", r)
	}
	want := AppendJSON{StreamID: "order-1", StreamVersion: 2, Events: []AppendedEventJSON{{EventID: id, GlobalSequence: 2, StreamVersion: 2}}}
	if !reflect.DeepEqual(out, want) {
		t.Fatalf("append --output json = %+v, want %+v", out, want)
	}
	for _, k := range []string{`"stream_id"`, `"stream_version"`, `"events"`, `"event_id"`, `"global_sequence"`} {
		if !strings.Contains(r.stdout, k) {
			t.Errorf("append --output json lacks %s: %s", k, r.stdout)
		}
	}
	// The same event again is a no-op that prints the stored one.
	if r2 := annals(t, db.URL, "append", "order-1", "order.shipped", `{"n":1}`, "--event-id", id, "--output", "json"); r2.code != 0 || r2.stdout != r.stdout {
		t.Fatalf("idempotent append --output json: %+v, want %q", r2, r.stdout)
	}
	if r := annals(t, db.URL, "append", "order-1", "order.shipped", `{}`, "--output", "jsonl"); r.code != ExitUsage || !strings.Contains(r.stderr, "want text or json") {
		t.Fatalf("append --output jsonl: %+v", r)
	}

	// Another event under the same ID.
	r = annals(t, db.URL, "append", "order-1", "order.shipped", `{"n":2}`, "--event-id", id)
	if r.code != ExitFailure || !strings.HasPrefix(r.stderr, "annals: some events") || strings.Contains(r.stderr, "annals: annals:") {
		t.Fatalf("reused event ID: %+v", r)
	}
	for _, nilID := range []string{"00000000-0000-0000-0000-000000000000", "00000000000000000000000000000000"} {
		r = annals(t, db.URL, "append", "order-1", "order.shipped", `{}`, "--event-id", nilID)
		if r.code != ExitUsage || !strings.Contains(r.stderr, "nil UUID") {
			t.Fatalf("--event-id %s: %+v", nilID, r)
		}
	}
	if r := annals(t, db.URL, "read", "order-1", "--output", "jsonl"); r.code != 0 || strings.Count(r.stdout, "\n") != 2 {
		t.Fatalf("the refused appends changed the stream: %+v", r)
	}
}

func TestMigratePrint(t *testing.T) {
	t.Parallel()
	r := annals(t, "", "migrate", "--print", "--schema", `My "Schema"`)
	if r.code != 0 {
		t.Fatalf("%+v", r)
	}
	for _, want := range []string{`CREATE SCHEMA IF NOT EXISTS "My ""Schema"""`, `CREATE TABLE "My ""Schema""".events`, `FUNCTION "My ""Schema""".append_events`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--print output lacks %s", want)
		}
	}
	// The printed script is complete: applying it with psql-like simple
	// protocol gives a working schema.
	db := annalstest.NewDB(t, nil)
	if _, err := db.Pool.Exec(context.Background(), r.stdout); err != nil {
		t.Fatalf("applying --print output: %v", err)
	}
	if _, err := db.Pool.Exec(context.Background(), `SELECT * FROM "My ""Schema""".append_events('s', 0, '[{"type":"t","data":{}}]')`); err != nil {
		t.Fatal(err)
	}
}

// The real binary maps outcomes to exit codes.
func TestBinaryExitCodes(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	bin := filepath.Join(t.TempDir(), "annals")
	build := exec.Command("go", "build", "-o", bin, "github.com/annals-dev/annals/cmd/annals")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	runBin := func(args ...string) (int, string) {
		c := exec.Command(bin, args...)
		c.Env = append(os.Environ(), "DATABASE_URL="+db.URL)
		out, _ := c.CombinedOutput()
		return c.ProcessState.ExitCode(), string(out)
	}
	if code, out := runBin("append", "s", "t", `{"ok":true}`); code != 0 {
		t.Fatalf("append: %d %s", code, out)
	}
	if code, out := runBin("append", "s", "t", `not json`); code != 2 {
		t.Fatalf("bad JSON: %d %s", code, out)
	}
	if code, out := runBin("append", "s", "t", `{}`, "--expected-version", "no-stream"); code != 1 {
		t.Fatalf("conflict: %d %s", code, out)
	}
	if code, out := runBin("read", "--output", "jsonl"); code != 0 || strings.Count(out, "\n") != 1 {
		t.Fatalf("read: %d %s", code, out)
	}
}

// annals bench --quick is the smoke test of the benchmark suite: it runs
// every contender briefly and prints the ratio table.
func TestBenchQuick(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	jsonPath := filepath.Join(t.TempDir(), "out", "append.json")
	r := annals(t, db.URL, "bench", "--quick", "--writers", "1,2", "--batch", "1,10", "--json", jsonPath)
	if r.code != 0 {
		t.Fatalf("bench: %+v", r)
	}
	// Two tables of four rows: the rates, then the CPU time per event.
	if !strings.Contains(r.stdout, "annals/raw") || !strings.Contains(r.stdout, "CPU per event") || strings.Count(r.stdout, "\n") != 13 {
		t.Fatalf("bench table:\n%s", r.stdout)
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []struct {
			Writers int     `json:"writers"`
			Batch   int     `json:"batch"`
			Raw     float64 `json:"raw_insert_events_per_sec"`
			Annals  float64 `json:"annals_events_per_sec"`
			VsRaw   float64 `json:"annals_vs_raw"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 4 {
		t.Fatalf("%d results, want 4", len(rep.Results))
	}
	for _, res := range rep.Results {
		if res.Raw <= 0 || res.Annals <= 0 || res.VsRaw <= 0 {
			t.Fatalf("empty measurement: %+v", res)
		}
	}
	if r = annals(t, db.URL, "bench", "--writers", "0"); r.code != 2 {
		t.Fatalf("bench --writers 0: %+v", r)
	}
	if r = annals(t, db.URL, "bench", "--latency-writers", "0"); r.code != 2 || !strings.Contains(r.stderr, "--latency-writers 0") {
		t.Fatalf("bench --latency-writers 0: %+v", r)
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)

	t.Run("UnknownCommand", func(t *testing.T) {
		r := annals(t, db.URL, "nosuchcommand")
		if r.code != ExitUsage || r.stdout != "" || r.stderr != "annals: unknown command \"nosuchcommand\" for \"annals\"\nRun 'annals --help' for usage.\n" {
			t.Errorf("%+v", r)
		}
		if r := annals(t, db.URL); r.code != ExitOK || !strings.Contains(r.stdout, "Exit codes: 0 success; 1 failure; 2 bad") {
			t.Errorf("annals without arguments: %+v", r)
		}
	})

	t.Run("NotFound", func(t *testing.T) {
		for _, args := range [][]string{
			{"read", "nosuchstream"},
			{"dlq", "show", "99"},
			{"schedule", "pause", "nosuchtask"},
			{"schedule", "cancel", "0191d6a4-0000-7000-8000-000000000000"},
			{"checkpoint", "get", "nosuchsubscriber"},
		} {
			r := annals(t, db.URL, args...)
			if r.code != ExitNotFound || r.stdout != "" || !strings.HasPrefix(r.stderr, "annals: ") || strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("annals %q: %+v", args, r)
			}
		}
	})

	// A schema that was never migrated says so and names the fix, once,
	// in the same words for every command, whatever the command touches
	// first (a function: 3F000, a table: 42P01) and however the library
	// wrapped the error.
	t.Run("NotMigrated", func(t *testing.T) {
		for _, args := range [][]string{
			{"append", "s", "t", `{}`},
			{"read"},
			{"read", "s"},
			{"tail"},
			{"checkpoint", "get", "x"},
			{"status"},
			{"dlq", "list"},
			{"dlq", "show", "1"},
			{"dlq", "retry", "1"},
			{"dlq", "purge", "--older-than", "1h"},
			{"schedule", "list"},
			{"schedule", "pause", "x"},
			{"stream", "info", "s"},
			{"forget", "x", "--yes"},
			{"verify"},
			{"archive", "status"},
		} {
			r := annals(t, db.URL, append(args, "--schema", "never_migrated")...)
			want := `annals: schema "never_migrated" is missing or not migrated (or migrated by an older annals than this one): 'annals migrate' creates or upgrades it (ERROR: `
			if r.code != ExitFailure || !strings.HasPrefix(r.stderr, want) || strings.Count(r.stderr, "\n") != 1 ||
				strings.Count(r.stderr, "annals migrate") != 1 {
				t.Errorf("annals %q: %+v", args, r)
			}
		}
	})
}

// A mistyped subcommand is the mistake reported, not the flags after it
// (which its group does not know): in every group of subcommands, for the
// first argument that names none of them (exit 2).
func TestUnknownSubcommandBeforeItsFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq", "lsit", "--subscriber", "mailer"}, `annals: unknown subcommand "lsit": want list, show, retry, skip or purge`},
		{[]string{"checkpoint", "gte", "balances", "--partition", "0"}, `annals: unknown subcommand "gte": want get or set`},
		{[]string{"schedule", "frob", "--output", "json"}, `annals: unknown subcommand "frob": want list, pause, resume, delete or cancel`},
		{[]string{"relay", "nast", "--url", "nats://x"}, `annals: unknown subcommand "nast": want nats`},
		{[]string{"relay", "nast"}, `annals: unknown subcommand "nast": want nats`},
		{[]string{"archive", "statsu", "--runs", "3"}, `annals: unknown command "statsu" for "annals archive"`},
		{[]string{"raed", "--from", "3"}, `annals: unknown command "raed" for "annals"`},
		// Without a subcommand, or with one that exists, an unknown flag
		// is the mistake.
		{[]string{"dlq", "--nosuchflag"}, "annals: unknown flag: --nosuchflag"},
		{[]string{"dlq", "list", "--nosuchflag"}, "annals: unknown flag: --nosuchflag"},
	} {
		r := annals(t, "", c.args...)
		if r.code != ExitUsage || !strings.HasPrefix(r.stderr, c.want+"\n") {
			t.Errorf("annals %q: %+v, want exit 2 and %q", c.args, r, c.want)
		}
	}

	// Every command with subcommands, found by walking the tree.
	e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	var walk func(c *cobra.Command)
	walked := 0
	walk = func(c *cobra.Command) {
		if !c.HasSubCommands() {
			return
		}
		walked++
		path := strings.Fields(c.CommandPath())[1:]
		args := append(slices.Clone(path), "frob", "--nosuchflag", "x")
		r := annals(t, "", args...)
		if r.code != ExitUsage || !strings.Contains(r.stderr, `"frob"`) || strings.Contains(r.stderr, "unknown flag") {
			t.Errorf("annals %q: %+v, want exit 2 naming frob", args, r)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(e.rootCommand())
	if walked < 8 {
		t.Fatalf("walked %d commands with subcommands, want at least 8", walked)
	}
}

// migrate --status lines its columns up: the name column is as wide as the
// longest name (several are longer than 20 characters).
func TestMigrateStatusAligned(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	r := annals(t, db.URL, "migrate", "--status")
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) < 30 {
		t.Fatalf("migrate --status: %+v", r)
	}
	long, col := 0, strings.Index(lines[0], " applied ")+1
	for _, l := range lines {
		if i := strings.Index(l, " applied "); i+1 != col {
			t.Errorf("the status of %q is at column %d, want %d", l, i+1, col)
		}
		long = max(long, len(strings.Fields(l)[1]))
	}
	if long <= 20 || col != len("0001  ")+long+2 {
		t.Errorf("longest name %d characters, status column %d:\n%s", long, col, r.stdout)
	}
}
