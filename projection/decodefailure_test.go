package projection_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

type decodedEvent struct {
	Amount int `json:"amount"`
}

// An event that a typed handler cannot decode into its type is a permanent
// failure: dead-lettered after one attempt, without waiting out the retry
// policy, with the decoding error; the other events are applied.
func TestDecodeFailureIsPermanent(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			reg := eventstore.NewRegistry()
			eventstore.MustRegister[decodedEvent](reg, "acct.decoded")
			const sub = "typed"
			var mu sync.Mutex
			var handled []int
			note := func(n int) {
				mu.Lock()
				defer mu.Unlock()
				handled = append(handled, n)
			}
			var handler any
			if k.projection {
				p := projection.New(sub, reg)
				projection.On(p, func(_ context.Context, _ pgx.Tx, e eventstore.Envelope[decodedEvent]) error {
					note(e.Data.Amount)
					return nil
				})
				handler = p
			} else {
				o := projection.NewObserver(sub, reg)
				projection.Observe(o, func(_ context.Context, e eventstore.Envelope[decodedEvent]) error {
					note(e.Data.Amount)
					return nil
				})
				handler = o
			}
			var bad eventstore.AppendedEvent
			for i, data := range []string{`{"amount": 10}`, `{"amount": "ten"}`, `{"amount": 30}`} {
				res, err := h.store.Append(t.Context(), fmt.Sprintf("s-%d", i), eventstore.Any,
					eventstore.EventData{Type: "acct.decoded", Data: json.RawMessage(data)})
				if err != nil {
					t.Fatal(err)
				}
				if i == 1 {
					bad = res.Events[0]
				}
			}
			run := h.newRunner(projection.RetryPolicy{MaxRetries: 3}, -1, failReg{handler, nil})
			if err := run.catchUp(); err != nil {
				t.Fatalf("RunUntilCaughtUp: %v\n%s", err, h.dump())
			}
			dls := h.deadLetters(sub)
			if len(dls) != 1 || dls[0].EventID != bad.ID || dls[0].Attempts != 1 {
				t.Fatalf("dead letters %v, want one for event %d after one attempt\n%s", dls, bad.GlobalSequence, h.dump())
			}
			if !strings.Contains(dls[0].Error, "decode event") || !strings.Contains(dls[0].Error, "cannot unmarshal string") {
				t.Errorf("the dead letter's error %q is not the decoding error", dls[0].Error)
			}
			if got := h.attempts(sub, bad.ID); !slices.Equal(got, []int{1}) {
				t.Errorf("failures attempts %v, want [1]", got)
			}
			if got := run.clock.requested(); len(got) != 0 {
				t.Errorf("waited %v before dead-lettering an undecodable event", got)
			}
			// (A projection handles 10 twice: its first batch rolled back.)
			mu.Lock()
			defer mu.Unlock()
			if got := slices.Compact(slices.Sorted(slices.Values(handled))); !slices.Equal(got, []int{10, 30}) {
				t.Errorf("handled %v, want 10 and 30", handled)
			}
		})
	}
}
