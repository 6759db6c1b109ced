package projection

import (
	"math"
	"testing"
	"time"

	"github.com/annals-dev/annals/catchup"
)

func TestReplayPace(t *testing.T) {
	var p replayPace
	if _, ok := p.estimate(100); ok {
		t.Fatal("an estimate before any drive")
	}
	p = replayPace{positions: 1000, took: 2 * time.Second}
	if d, ok := p.estimate(250); !ok || d != 500*time.Millisecond {
		t.Fatalf("250 positions at 1000 per 2s: %v %v, want 500ms", d, ok)
	}
	// A pace of hours a position (handler retry delays) over a large gap
	// overflows int64 nanoseconds: clamped, never negative.
	p = replayPace{positions: 1, took: 10 * time.Hour}
	if d, ok := p.estimate(5_000_000); !ok || d != time.Duration(math.MaxInt64) {
		t.Fatalf("5M positions at 10h each: %v %v, want the longest duration", d, ok)
	}
	if lowest([]*catchup.Lease{{Start: 7}, {Start: 3}, {Start: 9}}) != 3 || lowest(nil) != 0 {
		t.Fatal("lowest start of leases")
	}
}
