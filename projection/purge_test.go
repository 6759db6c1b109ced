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

// A caught-up leader purges the failed attempts of events it has since
// handled, and keeps those of dead-lettered events (their history); so the
// failures table does not grow without bound, and an event read again after
// a rewind starts with its full retry budget.
func TestFailurePurge(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub = "purged"
			evs := h.appendTo("acct-1", "acct-2", "acct-1", "acct-3")
			transient, poison := evs[1], evs[3]
			handler, _ := h.handler(k, sub, func(_ context.Context, e eventstore.Event, call int) error {
				switch {
				case e.ID == transient.ID && call < 3:
					return errors.Newf("transient failure %d", call)
				case e.ID == poison.ID:
					return errors.New("poison")
				}
				return nil
			})
			run := h.newRunner(projection.RetryPolicy{MaxRetries: 2, InitialDelay: time.Second, Jitter: -1}, -1,
				failReg{handler, &projection.Options{OnDeadLetter: projection.SkipEvent}})
			// Catching up purges nothing (it never idles): both histories are there.
			if err := run.catchUp(); err != nil {
				t.Fatal(err)
			}
			if got := h.attempts(sub, transient.ID); !slices.Equal(got, []int{1, 2}) {
				t.Fatalf("attempts of the transient event after catching up: %v, want [1 2]", got)
			}
			if got := h.attempts(sub, poison.ID); !slices.Equal(got, []int{1, 2, 3}) {
				t.Fatalf("attempts of the poison event after catching up: %v, want [1 2 3]", got)
			}
			// Live and idle: the handled event's attempts go, the dead letter's stay.
			h.start(run)
			h.waitFor(10*time.Second, "the purge of the handled event's attempts", func() bool {
				return len(h.attempts(sub, transient.ID)) == 0
			})
			if got := h.attempts(sub, poison.ID); !slices.Equal(got, []int{1, 2, 3}) {
				t.Errorf("attempts of the dead-lettered event after the purge: %v, want [1 2 3] kept", got)
			}
		})
	}
}
