package projection_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// The failed attempts of an event that then succeeds are deleted with its
// success (in the projection's transaction), so the failures table does not
// grow forever and a rewound event starts with its full retry budget; those
// of a dead-lettered event stay, its history.
func TestFailuresForgottenOnSuccess(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub = "forgets"
			evs := h.appendTo("acct-1", "acct-2", "acct-1", "acct-3")
			transient, poison := evs[1], evs[3]
			var seen []int
			handler, _ := h.handler(k, sub, func(_ context.Context, e eventstore.Event, call int) error {
				switch {
				case e.ID == transient.ID && call < 3:
					// The earlier attempts are there while it is retried.
					seen = append(seen, len(h.attempts(sub, transient.ID)))
					return errors.Newf("transient failure %d", call)
				case e.ID == poison.ID:
					return errors.New("poison")
				}
				return nil
			})
			run := h.newRunner(projection.RetryPolicy{MaxRetries: 2, InitialDelay: time.Second, Jitter: -1}, -1,
				failReg{handler, &projection.Options{OnDeadLetter: projection.SkipEvent}})
			if err := run.catchUp(); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(seen, []int{0, 1}) {
				t.Errorf("attempts recorded before each failing call: %v, want [0 1]", seen)
			}
			if got := h.attempts(sub, transient.ID); len(got) != 0 {
				t.Errorf("attempts of the event that succeeded: %v, want none", got)
			}
			if got := h.attempts(sub, poison.ID); !slices.Equal(got, []int{1, 2, 3}) {
				t.Errorf("attempts of the dead-lettered event: %v, want [1 2 3] kept", got)
			}
		})
	}
}
