package eventstore

import (
	"fmt"
	"testing"
	"time"
)

// TestInlineBackoff checks the pauses between inline retries: random,
// below a ceiling that doubles from 1 ms and stops at 64 ms, never zero,
// and spread (not the same value every time, which would keep conflicting
// writers in lock step).
func TestInlineBackoff(t *testing.T) {
	var total time.Duration
	for attempt := 1; attempt < 10; attempt++ {
		ceiling := time.Millisecond << min(attempt-1, 6)
		seen := map[time.Duration]bool{}
		var largest time.Duration
		for range 200 {
			d := inlineBackoff(attempt)
			if d <= 0 || d > ceiling {
				t.Fatalf("attempt %d: pause %v outside (0, %v]", attempt, d, ceiling)
			}
			seen[d] = true
			largest = max(largest, d)
		}
		if len(seen) < 100 {
			t.Errorf("attempt %d: only %d distinct pauses in 200", attempt, len(seen))
		}
		if largest < ceiling/2 {
			t.Errorf("attempt %d: largest pause %v, want the range up to %v used", attempt, largest, ceiling)
		}
		total += ceiling
	}
	if total > 260*time.Millisecond {
		t.Errorf("nine retries may pause %v in all, documented as under 0.26 s", total)
	}
}

// TestHotStreams checks the memory of streams that conflicted lately: a
// stream is hot for hotFor after its last conflict, at most hotMax are
// remembered, and expired ones make room.
func TestHotStreams(t *testing.T) {
	var h hotStreams
	t0 := time.Now()
	if h.is("a", t0) {
		t.Fatal("a stream that never conflicted is hot")
	}
	h.mark("a", t0)
	if !h.is("a", t0.Add(hotFor/2)) {
		t.Fatal("a stream is not hot right after a conflict")
	}
	h.mark("a", t0.Add(hotFor/2))
	if !h.is("a", t0.Add(hotFor)) {
		t.Fatal("a second conflict did not extend the stream's heat")
	}
	if h.is("a", t0.Add(2*hotFor)) {
		t.Fatal("a stream is still hot long after its last conflict")
	}
	if len(h.until) != 0 {
		t.Fatalf("an expired stream is still remembered: %v", h.until)
	}
	for i := range hotMax {
		h.mark(fmt.Sprint("s", i), t0)
	}
	h.mark("one too many", t0)
	if h.is("one too many", t0) || len(h.until) != hotMax {
		t.Fatalf("%d streams remembered, want at most %d", len(h.until), hotMax)
	}
	h.mark("s0", t0.Add(hotFor/2)) // a known stream is always updated
	later := t0.Add(hotFor + hotFor/4)
	h.mark("new", later) // every other stream has expired by now
	if !h.is("new", later) || !h.is("s0", later) || len(h.until) != 2 {
		t.Fatalf("after the others expired: %d remembered, new %v, s0 %v", len(h.until), h.is("new", later), h.is("s0", later))
	}
}
