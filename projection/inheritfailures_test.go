package projection_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// Leader A fails an event once and hands over (it shuts down while it waits
// to retry); leader B handles the event at its first try and deletes A's
// failed attempt with it. Only the attempts of the leader itself were
// deleted, so A's row stayed for ever: the console listed it as a failure in
// progress, and after a rewind the event started with part of its retries
// spent.
func TestFailuresOfEarlierLeaderForgotten(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub = "inherits"
			retry := projection.RetryPolicy{MaxRetries: 3, InitialDelay: time.Hour}
			a, _ := h.handler(k, sub, func(context.Context, eventstore.Event, int) error {
				return errors.New("transient")
			})
			runA := h.newRunner(retry, 0, failReg{a, nil}) // its retry delay never ends
			stopA := h.start(runA)
			evs := h.appendTo("a", "b")
			h.waitFor(failWait, "A's failed attempt", func() bool { return len(h.attempts(sub, evs[0].ID)) == 1 })
			stopA()

			b, _ := h.handler(k, sub, nil)
			runB := h.newRunner(retry, 0, failReg{b, nil})
			h.start(runB)
			h.waitFor(failWait, "B's handling of both events", func() bool {
				cp, _ := h.checkpoint(sub)
				return len(h.seen(sub)) == 2 && h.queryInt(`SELECT count(*) FROM annals.failures`) == 0 &&
					(k.projection || cp >= evs[1].Pos)
			})
			h.checkApplied(sub, evs)
			if n := h.queryInt(`SELECT count(*) FROM annals.dead_letters`); n != 0 {
				t.Errorf("%d dead letters, want none", n)
			}
		})
	}
}

// A new leader deletes the failed attempts at or below its checkpoint of
// events that are no dead letter (left behind by a leader that did not know
// of them, or passed over by a checkpoint set), and keeps those of dead
// letters, their history.
func TestFailuresBelowCheckpointDeletedAtLeadership(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub = "stale"
			evs := h.appendTo("ok", "poison", "ok")
			handler, _ := h.handler(k, sub, func(_ context.Context, e eventstore.Event, _ int) error {
				if e.StreamID == "poison" {
					return annals.Permanent(errors.New("poison"))
				}
				return nil
			})
			run := h.newRunner(projection.RetryPolicy{}, -1, failReg{handler, &projection.Options{OnDeadLetter: projection.SkipEvent}})
			if err := run.catchUp(); err != nil {
				t.Fatal(err)
			}
			// A row left behind for the first event, handled long since.
			if _, err := h.pool.Exec(t.Context(), `INSERT INTO annals.failures (subscriber_id, partition, event_id, global_sequence, attempt, error)
				VALUES ($1, 0, $2, $3, 1, 'left behind')`, sub, evs[0].ID, evs[0].Pos); err != nil {
				t.Fatal(err)
			}
			h.appendTo("ok")
			if err := run.catchUp(); err != nil { // a new leadership
				t.Fatal(err)
			}
			if got := h.attempts(sub, evs[0].ID); len(got) != 0 {
				t.Errorf("attempts of the handled event: %v, want none", got)
			}
			if got := h.attempts(sub, evs[1].ID); !slices.Equal(got, []int{1}) {
				t.Errorf("attempts of the dead-lettered event: %v, want [1] kept", got)
			}
		})
	}
}
