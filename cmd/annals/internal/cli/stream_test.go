package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

func TestStreamDeleteAndInfo(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for i := 0; i < 2; i++ {
		if r := annals(t, db.URL, "append", "order-1", "order.placed", `{"total": 1}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	if r := annals(t, db.URL, "append", "customer-7", "customer.registered", `{"name": "Ada"}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}

	r := annals(t, db.URL, "stream", "delete", "order-1", "--expected-version", "2", "--reason", "test")
	if r.code != 0 || r.stdout != "order-1 deleted at version 3, position 4\n" {
		t.Fatalf("stream delete: %+v", r)
	}
	if r = annals(t, db.URL, "read", "order-1"); r.code != 1 ||
		r.stderr != "annals: stream \"order-1\" is deleted (version 3): it has nothing to read until an append expecting exactly version 3 recreates it\n" {
		t.Fatalf("read of a deleted stream: %+v", r)
	}
	// A deleted stream exists (stream info shows it; a no-stream append
	// cannot recreate it): a second delete fails (exit 1), as the read
	// does, in a delete's words; read --help says so.
	if r = annals(t, db.URL, "stream", "delete", "order-1"); r.code != ExitFailure ||
		r.stderr != "annals: stream \"order-1\" is already deleted (version 3): there is nothing to delete (--hard makes it a tombstone)\n" {
		t.Fatalf("second delete: %+v", r)
	}
	if r = annals(t, db.URL, "read", "--help"); r.code != 0 || !strings.Contains(r.stdout, "A deleted one exits 1") {
		t.Fatalf("read --help: %+v", r)
	}
	r = annals(t, db.URL, "stream", "info", "order-1", "--output", "json")
	var info StreamInfoJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &info) != nil || info.State != "deleted" || info.Version != 3 || info.TruncateBefore != 4 {
		t.Fatalf("stream info: %+v %+v", r, info)
	}
	// Recreate with the expected version, through the CLI's append.
	if r = annals(t, db.URL, "append", "order-1", "order.placed", `{"total": 2}`, "--expected-version", "3"); r.code != 0 {
		t.Fatalf("recreate: %+v", r)
	}
	if r = annals(t, db.URL, "read", "order-1", "--output", "jsonl"); r.code != 0 || strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, `"stream_version":4`) {
		t.Fatalf("read of the recreated stream: %+v", r)
	}

	// --hard needs --yes without a terminal (usage error: nothing changed).
	if r = annals(t, db.URL, "stream", "delete", "customer-7", "--hard"); r.code != ExitUsage {
		t.Fatalf("hard delete without --yes: %+v", r)
	}
	r = annals(t, db.URL, "stream", "delete", "customer-7", "--hard", "--yes", "--output", "json")
	var del StreamDeleteJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &del) != nil || !del.Hard || del.StreamVersion != 2 {
		t.Fatalf("hard delete: %+v", r)
	}
	if r = annals(t, db.URL, "append", "customer-7", "customer.registered", `{}`); r.code != 1 || !strings.Contains(r.stderr, "hard-deleted") {
		t.Fatalf("append to a tombstone: %+v", r)
	}
	// A read says what the tombstone means for a read, not for an append.
	if r = annals(t, db.URL, "read", "customer-7"); r.code != 1 ||
		r.stderr != "annals: stream \"customer-7\" is hard-deleted (version 2): it has nothing to read, and never will\n" {
		t.Fatalf("read of a tombstone: %+v", r)
	}
	if r = annals(t, db.URL, "stream", "info", "customer-7"); r.code != 0 || !strings.Contains(r.stdout, "hard-deleted") {
		t.Fatalf("info of a tombstone: %+v", r)
	}
	for _, args := range [][]string{{"stream", "delete", "customer-7"}, {"stream", "delete", "customer-7", "--hard", "--yes"}} {
		if r = annals(t, db.URL, args...); r.code != ExitFailure ||
			r.stderr != "annals: stream \"customer-7\" is already hard-deleted (version 2): there is nothing to delete\n" {
			t.Fatalf("%q of a tombstone: %+v", args, r)
		}
	}
	// Not found, bad arguments.
	if r = annals(t, db.URL, "stream", "delete", "nope"); r.code != ExitNotFound ||
		r.stderr != "annals: stream \"nope\" does not exist: there is nothing to delete\n" {
		t.Fatalf("delete of a missing stream: %+v", r)
	}
	if r = annals(t, db.URL, "stream", "info", "nope"); r.code != ExitNotFound {
		t.Fatalf("info of a missing stream: %+v", r)
	}
	if r = annals(t, db.URL, "stream", "delete", "order-1", "--expected-version", "no-stream"); r.code != ExitUsage {
		t.Fatalf("delete expecting no stream: %+v", r)
	}
	if r = annals(t, db.URL, "stream", "frob"); r.code != ExitUsage {
		t.Fatalf("unknown subcommand: %+v", r)
	}
}

func TestStreamSetAndScavenge(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for i := 0; i < 5; i++ {
		if r := annals(t, db.URL, "append", "sensor-1", "reading.taken", `{"v": 1}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	if r := annals(t, db.URL, "append", "old", "x", `{}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	r := annals(t, db.URL, "stream", "set", "sensor-1", "--max-count", "2", "--max-age", "30d", "--output", "json")
	var info StreamInfoJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &info) != nil || info.MaxCount == nil || *info.MaxCount != 2 ||
		info.MaxAgeSeconds == nil || *info.MaxAgeSeconds != 30*86400 {
		t.Fatalf("stream set: %+v", r)
	}
	if r = annals(t, db.URL, "read", "sensor-1", "--output", "jsonl"); r.code != 0 || strings.Count(r.stdout, "\n") != 2 {
		t.Fatalf("read after max-count 2: %+v", r)
	}
	// A V beyond version + 1 (a typo) is refused, and changes nothing;
	// version + 1 hides every version (a wish, not a typo).
	if r = annals(t, db.URL, "stream", "set", "old", "--truncate-before", "1000"); r.code != ExitUsage ||
		!strings.Contains(r.stderr, "stream old is at version 1, so at most 2") {
		t.Fatalf("truncate beyond the version: %+v", r)
	}
	if r = annals(t, db.URL, "stream", "set", "nosuch", "--truncate-before", "3"); r.code != ExitNotFound {
		t.Fatalf("truncate of a missing stream: %+v", r)
	}
	if r = annals(t, db.URL, "stream", "info", "old"); r.code != 0 || !strings.Contains(r.stdout, "reads from version 1") {
		t.Fatalf("info after a refused truncate: %+v", r)
	}
	if r = annals(t, db.URL, "stream", "set", "old", "--truncate-before", "2"); r.code != 0 || !strings.Contains(r.stdout, "reads from version 2") {
		t.Fatalf("truncate: %+v", r)
	}
	// Five versions, the newest two kept: reads start at version 4.
	if r = annals(t, db.URL, "stream", "info", "sensor-1"); r.code != 0 || !strings.Contains(r.stdout, "max age 720h0m0s, max count 2, reads from version 4 (those younger") {
		t.Fatalf("info: %+v", r)
	}
	// Bad flags and missing streams change nothing.
	for _, args := range [][]string{
		{"stream", "set", "sensor-1"},
		{"stream", "set", "sensor-1", "--max-age", "soon"},
		{"stream", "set", "sensor-1", "--max-age", "NaNd"},
		{"stream", "set", "sensor-1", "--max-age", "0.000001d"},
		{"stream", "set", "sensor-1", "--max-count", "-1"},
		{"scavenge", "--batch", "0"},
		{"scavenge", "--pause", "-1s"},
	} {
		if r = annals(t, db.URL, args...); r.code != ExitUsage {
			t.Fatalf("%v: %+v, want exit 2", args, r)
		}
	}
	if r = annals(t, db.URL, "stream", "set", "nope", "--max-count", "1"); r.code != ExitNotFound {
		t.Fatalf("set on a missing stream: %+v", r)
	}

	// No run yet: --list says so (json: an empty array), as dlq list does.
	if r = annals(t, db.URL, "scavenge", "--list", "5"); r.code != 0 || r.stdout != "No scavenge runs.\n" {
		t.Fatalf("scavenge --list before any run: %+v", r)
	}
	if r = annals(t, db.URL, "scavenge", "--list", "5", "--output", "json"); r.code != 0 || r.stdout != "[]\n" {
		t.Fatalf("scavenge --list --output json before any run: %+v", r)
	}

	// The scavenge removes sensor-1 v1..3 and old v1; progress per batch.
	r = annals(t, db.URL, "scavenge", "--batch", "3", "--output", "jsonl")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var last struct {
		Removed int64 `json:"removed"`
		Done    bool  `json:"done"`
		RunID   int64 `json:"run_id"`
	}
	if r.code != 0 || len(lines) < 3 || json.Unmarshal([]byte(lines[len(lines)-1]), &last) != nil || !last.Done || last.Removed != 4 {
		t.Fatalf("scavenge: %+v", r)
	}
	if r = annals(t, db.URL, "read", "--output", "jsonl"); r.code != 0 || strings.Contains(r.stdout, `"stream_id":"old","stream_version"`) ||
		strings.Count(r.stdout, `"stream_id":"sensor-1","stream_version"`) != 2 {
		t.Fatalf("log after scavenging: %+v", r)
	}
	if r = annals(t, db.URL, "scavenge"); r.code != 0 || !strings.Contains(r.stdout, "done: 0 events removed") {
		t.Fatalf("second scavenge: %+v", r)
	}
	r = annals(t, db.URL, "scavenge", "--list", "5", "--output", "json")
	var runs []map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &runs) != nil || len(runs) != 2 || runs[1]["removed"].(float64) != 4 || runs[1]["started_by"] == "" {
		t.Fatalf("scavenge --list: %+v", r)
	}
}

// TestStreamSetChangesOnly: a lower --truncate-before is refused (exit 2),
// and a call that sets what is set already records nothing and says so
// (new-user trial: both exited 0 and appended a "$stream.truncated" record
// each time).
func TestStreamSetChangesOnly(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for i := 0; i < 5; i++ {
		if r := annals(t, db.URL, "append", "trunc-1", "x", `{"v": 1}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	records := func() int {
		t.Helper()
		r := annals(t, db.URL, "read", "$$trunc-1", "--output", "jsonl")
		if r.code == ExitNotFound {
			return 0
		}
		if r.code != 0 {
			t.Fatalf("read of the metadata stream: %+v", r)
		}
		return strings.Count(r.stdout, "\n")
	}
	// No max age to clear: unchanged, nothing recorded.
	if r := annals(t, db.URL, "stream", "set", "trunc-1", "--max-age", "0s"); r.code != 0 ||
		r.stdout != "stream trunc-1: unchanged (nothing recorded): max age none, max count none, reads from version 1\n" || records() != 0 {
		t.Fatalf("--max-age 0s without a max age: %+v", r)
	}
	if r := annals(t, db.URL, "stream", "set", "trunc-1", "--truncate-before", "3"); r.code != 0 ||
		!strings.Contains(r.stdout, "reads from version 3") || strings.Contains(r.stdout, "unchanged") || records() != 1 {
		t.Fatalf("--truncate-before 3: %+v", r)
	}
	if r := annals(t, db.URL, "stream", "set", "trunc-1", "--truncate-before", "2"); r.code != ExitUsage ||
		!strings.Contains(r.stderr, "the truncate-before of stream trunc-1 is 3 already, and it can only grow") || records() != 1 {
		t.Fatalf("--truncate-before 2 after 3: %+v", r)
	}
	if r := annals(t, db.URL, "stream", "set", "trunc-1", "--truncate-before", "3"); r.code != 0 ||
		!strings.Contains(r.stdout, "unchanged") || records() != 1 {
		t.Fatalf("--truncate-before 3 again: %+v", r)
	}
	if r := annals(t, db.URL, "stream", "set", "trunc-1", "--max-count", "2"); r.code != 0 || strings.Contains(r.stdout, "unchanged") || records() != 2 {
		t.Fatalf("--max-count 2: %+v", r)
	}
	r := annals(t, db.URL, "stream", "set", "trunc-1", "--max-count", "2", "--output", "json")
	var out StreamSetJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil || !out.Unchanged || out.MaxCount == nil || *out.MaxCount != 2 ||
		out.TruncateBefore != 3 || records() != 2 {
		t.Fatalf("--max-count 2 again: %+v %+v", r, out)
	}
	// The records read compact in text, as user events do (they read
	// `{"stream_id" : "trunc-1", ...}`).
	if r = annals(t, db.URL, "read", "$$trunc-1"); r.code != 0 || !strings.Contains(r.stdout, `{"stream_id":"trunc-1","truncate_before":3,`) {
		t.Fatalf("read of the metadata stream in text: %+v", r)
	}
}
