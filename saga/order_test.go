package saga_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
)

type orderState struct {
	Seen []string `json:"seen"`
}

// An instance whose events come from two streams sees them in log order
// while none is dead-lettered. A dead letter breaks that order under
// ParkStream (the default) and SkipEvent: the instance's events from other
// streams flow on, and the dead letter, retried later, is handled after
// them. Under Stop nothing moves past the dead letter, so the retried event
// is handled first and the instance keeps log order. docs/sagas.md
// ("Ordering") states this.
func TestInstanceOrderAcrossStreamsAfterADeadLetter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy projection.DeadLetterPolicy
		want   string // what the instance handled, in order
	}{
		{projection.DefaultPolicy, "[payments#2 orders#1]"},
		{projection.SkipEvent, "[payments#2 orders#1]"},
		{projection.Stop, "[orders#1 payments#2]"},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var broken atomic.Bool
			broken.Store(true)
			s := saga.New[orderState]("ordered", b.reg)
			saga.On(s, func(e eventstore.Envelope[Added]) string { return e.Data.ID },
				func(ctx context.Context, inst *saga.Instance[orderState], e eventstore.Envelope[Added]) error {
					if broken.Load() && e.StreamID == "orders" {
						return errors.New("payment service down")
					}
					inst.State.Seen = append(inst.State.Seen, fmt.Sprintf("%s#%d", e.StreamID, e.Data.N))
					return nil
				})
			r := b.runner(t)
			opts := &projection.Options{OnDeadLetter: tc.policy, Retry: &projection.RetryPolicy{MaxRetries: -1}}
			if err := saga.Register(r, s, &saga.Config{Store: b.store, Options: opts}); err != nil {
				t.Fatal(err)
			}
			b.append(t, "orders", Added{ID: "o1", N: 1}) // first in the log
			b.append(t, "payments", Added{ID: "o1", N: 2})
			run := func() {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				_ = r.RunUntilCaughtUp(ctx) // under Stop it reports the halt
			}
			run()

			broken.Store(false)
			dl, err := deadletter.New(b.db.Pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := dl.RetryAll(t.Context(), "ordered"); err != nil {
				t.Fatal(err)
			}
			run()
			st, err := saga.Lookup[orderState](t.Context(), b.db.Pool, "", "ordered", "o1")
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(st.State.Seen); got != tc.want {
				t.Errorf("instance o1 handled %s, want %s (log order: orders#1, payments#2)", got, tc.want)
			}
		})
	}
}
