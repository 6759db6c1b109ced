package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

func TestArchiveCommand(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for i := 0; i < 12; i++ {
		if r := annals(t, db.URL, "append", "order-1", "order.placed", `{"total": 1}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	before := annals(t, db.URL, "read", "--output", "jsonl")
	for _, args := range [][]string{
		{"archive"},
		{"archive", "--before", "0"},
		{"archive", "--before", "5", "--batch", "0"},
		{"archive", "--before", "5", "--pause", "-1s"},
		{"archive", "status", "--runs", "-1"},
	} {
		if r := annals(t, db.URL, args...); r.code != ExitUsage {
			t.Fatalf("%v: %+v, want exit 2", args, r)
		}
	}
	// A --before past the head + 1 would archive everything: a typo, refused
	// with the head named, as checkpoint set refuses a position past it. A
	// malformed one gets checkpoint set's words, not strconv's.
	if r := annals(t, db.URL, "archive", "--before", "99999"); r.code != ExitUsage ||
		!strings.HasPrefix(r.stderr, "annals: --before 99999 is beyond the head of the log (12): at most 13,") {
		t.Fatalf("archive --before 99999: %+v", r)
	}
	if r := annals(t, db.URL, "archive", "--before", "abc"); r.code != ExitUsage ||
		!strings.HasPrefix(r.stderr, "annals: --before \"abc\": want a non-negative integer\n") {
		t.Fatalf("archive --before abc: %+v", r)
	}
	if r := annals(t, db.URL, "archive", "status"); r.code != 0 || !strings.Contains(r.stdout, "horizon 1 (head 12): 0 events moved") {
		t.Fatalf("refused archives ran: %+v", r)
	}

	// Progress per step (jsonl), then the final state.
	r := annals(t, db.URL, "archive", "--before", "9", "--batch", "3", "--output", "jsonl")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var last struct {
		Moved      int64 `json:"moved"`
		Done       bool  `json:"done"`
		ArchivedTo int64 `json:"archived_to"`
	}
	if r.code != 0 || len(lines) != 3 || json.Unmarshal([]byte(lines[2]), &last) != nil || !last.Done || last.Moved != 8 || last.ArchivedTo != 8 {
		t.Fatalf("archive: %+v", r)
	}
	// Reads are unchanged.
	if after := annals(t, db.URL, "read", "--output", "jsonl"); after.code != 0 || after.stdout != before.stdout {
		t.Fatalf("read after archiving:\n%s\nbefore:\n%s", after.stdout, before.stdout)
	}
	if r := annals(t, db.URL, "read", "order-1", "--output", "jsonl"); r.code != 0 || strings.Count(r.stdout, "\n") != 12 {
		t.Fatalf("read of the stream after archiving: %+v", r)
	}
	// Everything but the newest event, in text.
	if r = annals(t, db.URL, "archive", "--before", "13"); r.code != 0 || !strings.Contains(r.stdout, "done: 3 events moved; positions below 12 are archived") {
		t.Fatalf("second archive: %+v", r)
	}
	// Nothing left to move: it says so; the run is recorded (0 moved), so
	// the status below lists five.
	if r = annals(t, db.URL, "archive", "--before", "3"); r.code != 0 ||
		!strings.Contains(r.stdout, ": nothing to archive below 3: positions below 12 are archived already") || strings.Contains(r.stdout, "%") {
		t.Fatalf("archive below the horizon: %+v", r)
	}
	if r = annals(t, db.URL, "archive", "--before", "13"); r.code != 0 || !strings.Contains(r.stdout, ": nothing to archive below 13: ") {
		t.Fatalf("archive with only the newest event left: %+v", r)
	}
	var none struct {
		RunID int64 `json:"run_id"`
		Done  bool  `json:"done"`
		Moved int64 `json:"moved"`
	}
	if r = annals(t, db.URL, "archive", "--before", "3", "--output", "json"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &none) != nil ||
		none.RunID == 0 || !none.Done || none.Moved != 0 {
		t.Fatalf("archive below the horizon, json: %+v", r)
	}
	r = annals(t, db.URL, "archive", "status", "--output", "json")
	var st struct {
		Horizon      int64            `json:"horizon"`
		Moved        int64            `json:"moved"`
		Head         int64            `json:"head"`
		ArchiveBytes int64            `json:"archive_bytes"`
		Runs         []map[string]any `json:"runs"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.Horizon != 12 || st.Moved != 11 || st.Head != 12 ||
		st.ArchiveBytes == 0 || len(st.Runs) != 5 || st.Runs[4]["moved"].(float64) != 8 || st.Runs[0]["started_by"] == "" {
		t.Fatalf("archive status: %+v %+v", r, st)
	}
	// The runs that moved nothing say so: they printed "positions 12..11".
	if r = annals(t, db.URL, "archive", "status"); r.code != 0 || !strings.Contains(r.stdout, "horizon 12 (head 12): 11 events moved") ||
		!strings.Contains(r.stdout, "below 3, nothing to move, archived to 11, 0 moved") || strings.Contains(r.stdout, "positions 12..11") {
		t.Fatalf("archive status: %+v", r)
	}
}
