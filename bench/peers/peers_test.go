package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
)

// TestMain lets the test binary stand in for the program when the
// multi-process workload re-executes it as a child.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == childCommand {
		if err := childMain(context.Background(), os.Args[2:], os.Stdout); err != nil {
			os.Stderr.WriteString("peers child: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	annalstest.Main(m)
}

// TestSmoke runs every contender on every workload with tiny durations, on
// a fresh database, and checks the report: every cell measured, annals and
// the locked baseline skip nothing, and the check sees watermill's reader
// stall behind the unrelated transaction.
func TestSmoke(t *testing.T) {
	db := annalstest.NewDB(t, nil)
	t.Setenv("DATABASE_URL", db.URL)
	hold := 800 * time.Millisecond
	var out, progress bytes.Buffer
	err := run(t.Context(), []string{
		"-database-url", db.URL, "-prefix", "peers_smoke", "-output", "json",
		"-rounds", "1", "-duration", "200ms", "-catchup-events", "3000",
		"-tail-duration", "1s", "-hold", hold.String(), "-drain", "500ms", "-child-start", "1s",
	}, &out, &progress)
	if err != nil {
		t.Fatalf("run: %v\nprogress:\n%s", err, progress.String())
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("decode the report: %v\n%s", err, out.String())
	}
	if len(rep.Appends) != len(workloads) {
		t.Fatalf("%d append workloads in the report, want %d", len(rep.Appends), len(workloads))
	}
	for _, r := range rep.Appends {
		for _, n := range contenderNames {
			c := r.Cells[n]
			if c == nil || c.Median <= 0 || c.VsAnnals <= 0 {
				t.Errorf("%s, %s: no figure (%+v)", r.Label, n, c)
				continue
			}
			// The test cluster runs on this machine: the server's CPU time
			// is measured too.
			if c.CPU == nil || c.CPU.Server == nil || *c.CPU.Server <= 0 || c.CPU.Client <= 0 || len(c.CPURounds) != 1 {
				t.Errorf("%s, %s: CPU per event %+v (note %q)", r.Label, n, c.CPU, rep.ServerCPUNote)
			}
		}
	}
	if rep.Catchup == nil {
		t.Fatal("no catch-up figures")
	}
	for _, n := range catchupContenders {
		if c := rep.Catchup.Cells[n]; c == nil || c.Median <= 0 || c.Partial {
			t.Errorf("catch-up, %s: no full read (%+v)", n, c)
		}
	}
	if rep.Tail == nil {
		t.Fatal("no tailing check")
	}
	for _, set := range []map[string]*tailResult{rep.Tail.Results, rep.Tail.Held} {
		for _, n := range contenderNames {
			r := set[n]
			if r == nil || r.Appended == 0 {
				t.Fatalf("tailing check, %s: nothing appended (%+v)", n, r)
			}
			if n == annalsName || n == rawLockedName {
				if r.Skipped != 0 || r.Duplicates != 0 || r.Delivered != r.Appended {
					t.Errorf("tailing check, %s: %+v; want every event once", n, r)
				}
			}
		}
	}
	// watermill reads below the oldest open transaction, so whatever commits
	// while the unrelated one is open waits for it.
	if got := rep.Tail.Held[watermillName].DelayMax; got < hold*8/10 {
		t.Errorf("watermill's longest delay with a transaction held %s is %s; the check does not see the stall", hold, got)
	}
	var text bytes.Buffer
	if err := writeText(&text, &rep); err != nil || !bytes.Contains(text.Bytes(), []byte("| 16 writers × 1 event per append | 1.00 (")) {
		t.Errorf("text report (%v):\n%s", err, text.String())
	}
}
