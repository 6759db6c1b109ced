package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
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
