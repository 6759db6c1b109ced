package projectioncmd

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/projection"
)

// TestProgressSaysWhyItWaits: a blue/green rebuild whose cut-over waits for
// dead letters says so at once, on a line of its own, and again only when
// the reason changes.
func TestProgressSaysWhyItWaits(t *testing.T) {
	var out bytes.Buffer
	now := time.Unix(0, 0)
	p := &progress{w: &out, interval: time.Hour, now: func() time.Time { return now }, lastOut: now}
	r := projection.RebuildProgress{Projection: "bgm", Done: 10, Total: 10}
	p.update(r)
	r.Waiting = "3 unresolved dead letters: annals dlq retry"
	p.update(r)
	p.update(r)
	r.Waiting = "2 unresolved dead letters: annals dlq retry"
	p.update(r)
	got := out.String()
	if n := strings.Count(got, "waiting:"); n != 2 {
		t.Fatalf("%d waiting lines, want 2:\n%s", n, got)
	}
	if !strings.Contains(got, "rebuild bgm: waiting: 3 unresolved dead letters: annals dlq retry\n") {
		t.Fatalf("output:\n%s", got)
	}
}
