package eventstore

import (
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
