package projection

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/telemetry"
)

// A HandlerTimeout too large for a deadline (math.MaxInt64 is a common way
// to say "never") means no timeout, on the shared-context path and on the
// traced one alike; a large one that is still a deadline stays one.
func TestHandlerTimeoutUnbounded(t *testing.T) {
	t.Parallel()
	tel, err := telemetry.NewSubscription(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		timeout  time.Duration
		deadline bool
	}{
		{"MaxInt64", math.MaxInt64, false},
		{"TwoHundredYears", 200 * 365 * 24 * time.Hour, false},
		{"OneDay", 24 * time.Hour, true},
	} {
		for _, traced := range []bool{false, true} {
			name := tc.name
			if traced {
				name += "/Traced"
			}
			t.Run(name, func(t *testing.T) {
				r := &Runner{tel: tel, cfg: Config{Clock: realClock{}, HandlerSpans: traced}}
				f := r.failures("unbounded", Options{HandlerTimeout: tc.timeout})
				var has bool
				var left time.Duration
				err := f.deliver(context.Background(), eventstore.Event{Type: "t"}, func(ctx context.Context, _ eventstore.Event) error {
					var d time.Time
					d, has = ctx.Deadline()
					left = time.Until(d)
					return ctx.Err()
				})
				f.releaseContext()
				if err != nil {
					t.Fatalf("deliver: %v", err)
				}
				if has != tc.deadline {
					t.Fatalf("deadline set: %v (%v left), want %v", has, left, tc.deadline)
				}
				if has && (left < tc.timeout-time.Minute || left > tc.timeout+time.Minute) {
					t.Fatalf("%v left before the deadline, want about %v", left, tc.timeout)
				}
			})
		}
	}
}
