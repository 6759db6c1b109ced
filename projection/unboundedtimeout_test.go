package projection_test

import (
	"math"
	"testing"

	"github.com/annals-dev/annals/projection"
)

// HandlerTimeout: math.MaxInt64 ("never") used to put every handler's
// deadline centuries in the past (the deadline arithmetic overflowed), so
// every event was dead-lettered "handler timed out".
func TestFailureHandlerTimeoutMaxInt64(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			sub, _ := h.handler(k, "maxtimeout", nil)
			run := h.newRunner(projection.RetryPolicy{MaxRetries: -1}, -1,
				failReg{sub, &projection.Options{HandlerTimeout: math.MaxInt64}})
			evs := h.appendTo("a", "b")
			if err := run.catchUp(); err != nil {
				t.Fatal(err)
			}
			if d := h.deadLetters("maxtimeout"); len(d) != 0 {
				t.Fatalf("dead letters %v", d)
			}
			h.checkApplied("maxtimeout", evs)
		})
	}
}
