package cli

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

// TestOutput runs every command that prints data with each --output format:
// what it offers prints valid JSON (json: one document; jsonl: one object a
// line), what it does not offer and a bad value are usage errors (exit 2)
// naming the allowed values, and the old --format still works.
func TestOutput(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for _, args := range [][]string{
		{"append", "order-1", "order.placed", `{"total": 100}`},
		{"append", "order-1", "order.shipped", `{}`},
		{"append", "order-2", "order.placed", `[1,2]`},
		{"checkpoint", "set", "orders", "1", "--create", "--yes"},
	} {
		if r := annals(t, db.URL, args...); r.code != ExitOK {
			t.Fatalf("annals %q: %+v", args, r)
		}
	}
	dl := strconv.FormatInt(dlqAdd(t, db, dlqRow{seq: 2, err: "boom"}), 10)
	all, err := migrations.All(nil)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		args    []string
		formats []string // besides text
		// items is the length of the json array and the number of jsonl
		// lines of a list; -1 for a single object.
		items int
		// key is a key every object must have.
		key string
	}{
		{"Read", []string{"read"}, []string{"json", "jsonl"}, 3, "global_sequence"},
		{"ReadStream", []string{"read", "order-1"}, []string{"json", "jsonl"}, 2, "stream_version"},
		{"Tail", []string{"tail"}, []string{"json", "jsonl"}, 3, "event_type"},
		{"Status", []string{"status"}, []string{"json"}, -1, "subscribers"},
		{"DlqList", []string{"dlq", "list"}, []string{"json", "jsonl"}, 1, "subscriber_id"},
		{"DlqShow", []string{"dlq", "show", dl}, []string{"json"}, -1, "error_detail"},
		{"CheckpointGet", []string{"checkpoint", "get", "orders"}, []string{"json"}, -1, "position"},
		{"ScheduleList", []string{"schedule", "list"}, []string{"json"}, -1, "timers"},
		{"MigrateStatus", []string{"migrate", "--status"}, []string{"json", "jsonl"}, len(all), "applied_at"},
		{"Verify", []string{"verify"}, []string{"json"}, -1, "ok"},
		{"Version", []string{"version"}, []string{"json"}, -1, "schema_version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if r := annals(t, db.URL, tc.args...); r.code != ExitOK || r.stdout == "" {
				t.Fatalf("text: %+v", r)
			}
			if r := annals(t, db.URL, append(tc.args, "--output", "text")...); r.code != ExitOK || r.stdout == "" {
				t.Fatalf("--output text: %+v", r)
			}
			wantErr := "want " + orList(append([]string{"text"}, tc.formats...))
			for _, f := range []string{"json", "jsonl", "xml", "", "JSON"} {
				r := annals(t, db.URL, append(tc.args, "--output", f)...)
				if !slices.Contains(tc.formats, f) {
					if r.code != ExitUsage || r.stdout != "" || !strings.Contains(r.stderr, wantErr) {
						t.Errorf("--output %q: want exit 2 and %q, got %+v", f, wantErr, r)
					}
					continue
				}
				if r.code != ExitOK {
					t.Fatalf("--output %s: %+v", f, r)
				}
				var objs []map[string]json.RawMessage
				if f == "json" && tc.items < 0 {
					var obj map[string]json.RawMessage
					if err := json.Unmarshal([]byte(r.stdout), &obj); err != nil {
						t.Fatalf("--output json is not one JSON object: %v\n%s", err, r.stdout)
					}
					objs = append(objs, obj)
				} else if f == "json" {
					if err := json.Unmarshal([]byte(r.stdout), &objs); err != nil {
						t.Fatalf("--output json is not a JSON array of objects: %v\n%s", err, r.stdout)
					}
				} else {
					for _, line := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
						var obj map[string]json.RawMessage
						if err := json.Unmarshal([]byte(line), &obj); err != nil {
							t.Fatalf("--output jsonl: line %q is not a JSON object: %v", line, err)
						}
						objs = append(objs, obj)
					}
				}
				if want := max(tc.items, 1); len(objs) != want {
					t.Fatalf("--output %s: %d objects, want %d:\n%s", f, len(objs), want, r.stdout)
				}
				for _, o := range objs {
					if _, ok := o[tc.key]; !ok {
						t.Fatalf("--output %s: no key %q in %v", f, tc.key, o)
					}
				}
			}
		})
	}

	t.Run("LegacyFormat", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ old, now []string }{
			{[]string{"read", "--format", "jsonl"}, []string{"read", "--output", "jsonl"}},
			{[]string{"read", "--format", "table"}, []string{"read"}},
			{[]string{"tail", "--format", "jsonl"}, []string{"tail", "--output", "jsonl"}},
			{[]string{"dlq", "list", "--format", "jsonl"}, []string{"dlq", "list", "--output", "jsonl"}},
			{[]string{"dlq", "list", "--format", "table"}, []string{"dlq", "list"}},
			{[]string{"schedule", "list", "--format", "table"}, []string{"schedule", "list"}},
			{[]string{"verify", "--format", "json"}, []string{"verify", "--output", "json"}},
		} {
			old, now := annals(t, db.URL, tc.old...), annals(t, db.URL, tc.now...)
			if old.code != ExitOK || old != now {
				t.Errorf("annals %q: %+v\nannals %q: %+v", tc.old, old, tc.now, now)
			}
		}
		// status prints the server's time, so only the shape is compared.
		if r := annals(t, db.URL, "status", "--format", "json"); r.code != ExitOK || !json.Valid([]byte(r.stdout)) {
			t.Errorf("status --format json: %+v", r)
		}
		if r := annals(t, db.URL, "read", "--format", "xml"); r.code != ExitUsage || !strings.Contains(r.stderr, "want text, json or jsonl") {
			t.Errorf("read --format xml: %+v", r)
		}
		// Both spellings given: they must agree.
		for _, args := range [][]string{
			{"read", "--format", "json", "--output", "jsonl"},
			{"read", "--output", "jsonl", "--format", "json"},
			{"read", "--format", "table", "--output", "json"},
			{"tail", "--output", "jsonl", "--format", "text"},
		} {
			if r := annals(t, db.URL, args...); r.code != ExitUsage || r.stdout != "" || !strings.Contains(r.stderr, "says otherwise") {
				t.Errorf("annals %q: %+v", args, r)
			}
		}
		// The message quotes the other flag as the user spelled it.
		if r := annals(t, db.URL, "read", "--format", "table", "--output", "json"); !strings.Contains(r.stderr, "--format table says otherwise") {
			t.Errorf("read --format table --output json: %+v", r)
		}
		for _, args := range [][]string{
			{"read", "--format", "table", "--output", "text"},
			{"read", "--output", "jsonl", "--format", "jsonl"},
		} {
			if r := annals(t, db.URL, args...); r.code != ExitOK {
				t.Errorf("annals %q: %+v", args, r)
			}
		}
		if r := annals(t, db.URL, "read", "--help"); strings.Contains(r.stdout, "--format") {
			t.Errorf("read --help shows the deprecated --format:\n%s", r.stdout)
		}
	})

	t.Run("EmptyListIsEmptyArray", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{
			{"read", "--from", "100", "--output", "json"},
			{"dlq", "list", "--subscriber", "nobody", "--output", "json"},
		} {
			if r := annals(t, db.URL, args...); r.code != ExitOK || r.stdout != "[]\n" {
				t.Errorf("annals %q: %+v", args, r)
			}
		}
		if r := annals(t, db.URL, "read", "--from", "100", "--output", "jsonl"); r.code != ExitOK || r.stdout != "" {
			t.Errorf("read --output jsonl past the head: %+v", r)
		}
	})

	// Applying writes one object (TestSetupOutputJSON): not JSON lines;
	// --print writes SQL.
	t.Run("MigrateOutputJSONLNeedsStatus", func(t *testing.T) {
		t.Parallel()
		if r := annals(t, db.URL, "migrate", "--output", "jsonl"); r.code != ExitUsage || !strings.Contains(r.stderr, "needs --status") {
			t.Errorf("migrate --output jsonl: %+v", r)
		}
		for _, args := range [][]string{
			{"migrate", "--print", "--output", "json"},
			{"grant", "writer", "app", "--print", "--output", "json"},
		} {
			if r := annals(t, db.URL, args...); r.code != ExitUsage || !strings.Contains(r.stderr, "cannot be combined with --print") {
				t.Errorf("annals %q: %+v", args, r)
			}
		}
	})

	t.Run("Version", func(t *testing.T) {
		t.Parallel()
		want := fmt.Sprintf("schema version %d", all[len(all)-1].Version)
		for _, args := range [][]string{{"--version"}, {"-v"}, {"version"}} {
			r := annals(t, "", args...)
			if r.code != ExitOK || !strings.HasPrefix(r.stdout, "annals ") || !strings.Contains(r.stdout, want) || r.stderr != "" {
				t.Errorf("annals %q: want %q, got %+v", args, want, r)
			}
		}
		r := annals(t, "", "version", "--output", "json")
		var v VersionJSON
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || r.code != ExitOK {
			t.Fatalf("version --output json: %v %+v", err, r)
		}
		if v.Version == "" || v.SchemaVersion != len(all) || v.GoVersion == "" {
			t.Errorf("version --output json: %+v", v)
		}
	})

	t.Run("Completion", func(t *testing.T) {
		t.Parallel()
		for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
			r := annals(t, "", "completion", shell)
			if r.code != ExitOK || !strings.Contains(r.stdout, "annals") || len(r.stdout) < 1000 || r.stderr != "" {
				t.Errorf("completion %s: exit %d, %d bytes, stderr %q", shell, r.code, len(r.stdout), r.stderr)
			}
		}
		for _, args := range [][]string{{"completion", "tcsh"}, {"completion"}} {
			if r := annals(t, "", args...); r.code != ExitUsage || r.stdout != "" || !strings.Contains(r.stderr, "bash, zsh, fish or powershell") {
				t.Errorf("annals %q: %+v", args, r)
			}
		}
		// The completion script calls the hidden __complete command.
		r := annals(t, "", "__complete", "dlq", "")
		if r.code != ExitOK || !strings.Contains(r.stdout, "list") || !strings.Contains(r.stdout, "retry") {
			t.Errorf("__complete dlq: %+v", r)
		}
	})
}
