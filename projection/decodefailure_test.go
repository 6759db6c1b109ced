package projection_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
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

// A typed handler's event is upcast once per handler call (the runner's
// Config.Registry, when it has one, upcasts it before the typed handler,
// whose decoding then finds it current), and an event whose upcast fails is
// retried by the policy, not made permanent like undecodable data: one
// upcast per attempt.
func TestTypedHandlerUpcastsOnce(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		for _, runnerReg := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/RunnerRegistry=%v", k.name, runnerReg), func(t *testing.T) {
				t.Parallel()
				h := newFailHarness(t)
				var mu sync.Mutex
				upcasts, handled := map[int]int{}, map[int]int{}
				reg := eventstore.NewRegistry()
				eventstore.MustRegister[decodedEvent](reg, "acct.decoded")
				reg.MustRegisterUpcaster("acct.decoded", 1, func(d json.RawMessage) (json.RawMessage, error) {
					var v1 struct {
						Amt int `json:"amt"`
					}
					if err := json.Unmarshal(d, &v1); err != nil {
						return nil, err
					}
					mu.Lock()
					upcasts[v1.Amt]++
					mu.Unlock()
					if v1.Amt < 0 {
						return nil, errors.New("the upcaster refuses negative amounts")
					}
					return json.Marshal(decodedEvent{Amount: v1.Amt})
				})
				note := func(n int) {
					mu.Lock()
					defer mu.Unlock()
					handled[n]++
				}
				const sub = "upcast-once"
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
				// h.store's registry has no upcasters: the events are stored
				// at schema version 1, as by an older producer.
				var bad eventstore.AppendedEvent
				for i, amt := range []int{10, 20, -1, 30} {
					res, err := h.store.Append(t.Context(), fmt.Sprintf("s-%d", i), eventstore.Any,
						eventstore.EventData{Type: "acct.decoded", Data: map[string]int{"amt": amt}})
					if err != nil {
						t.Fatal(err)
					}
					if amt < 0 {
						bad = res.Events[0]
					}
				}
				cfg := &projection.Config{
					LockRetryInterval: 100 * time.Millisecond,
					RetryBackoff:      50 * time.Millisecond,
					Retry:             &projection.RetryPolicy{MaxRetries: 2, Jitter: -1},
					Clock:             &failClock{fire: -1},
					Logger:            h.logs.logger(),
				}
				if runnerReg {
					cfg.Registry = reg
				}
				r, err := projection.NewRunner(h.pool, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Register(handler, nil); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				if err := r.RunUntilCaughtUp(ctx); err != nil {
					t.Fatalf("RunUntilCaughtUp: %v\n%s", err, h.dump())
				}
				if got := h.attempts(sub, bad.ID); !slices.Equal(got, []int{1, 2, 3}) {
					t.Errorf("failures attempts of the event whose upcast fails %v, want [1 2 3] (retried, not permanent)\n%s", got, h.dump())
				}
				mu.Lock()
				defer mu.Unlock()
				for _, amt := range []int{10, 20, 30} {
					// (A projection handles 10 and 20 again after the batch
					// with the failing event rolled back.)
					if handled[amt] == 0 || upcasts[amt] != handled[amt] {
						t.Errorf("event %d: upcast %d times for %d handler calls, want once per call", amt, upcasts[amt], handled[amt])
					}
				}
				if upcasts[-1] != 3 {
					t.Errorf("the failing event was upcast %d times in 3 attempts", upcasts[-1])
				}
			})
		}
	}
}

// An event whose personal fields are still encrypted, read by a runner
// without a KEK, does not decode into the typed handler's type: a permanent
// failure (eventstore.ErrDecode, also ErrNoKEK), dead-lettered after one
// attempt.
func TestDecodeFailureWithoutKEKIsPermanent(t *testing.T) {
	t.Parallel()
	h := newFailHarness(t)
	type customer struct {
		CustomerID string `json:"customer_id"`
		Name       string `json:"name" annals:"personal"`
	}
	newReg := func() *eventstore.Registry {
		reg := eventstore.NewRegistry()
		if err := eventstore.Register[customer](reg, "customer.named", eventstore.PersonalData("CustomerID")); err != nil {
			t.Fatal(err)
		}
		return reg
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	kek, err := eventstore.NewLocalKEK(key)
	if err != nil {
		t.Fatal(err)
	}
	writer, err := eventstore.New(h.pool, &eventstore.Config{Registry: newReg(), KEK: kek})
	if err != nil {
		t.Fatal(err)
	}
	res, err := writer.Append(t.Context(), "customer-1", eventstore.NoStream, eventstore.NewEvent(customer{CustomerID: "c-1", Name: "Ada"}))
	if err != nil {
		t.Fatal(err)
	}
	// The runner's registry belongs to a store without a KEK.
	reg := newReg()
	if _, err := eventstore.New(h.pool, &eventstore.Config{Registry: reg}); err != nil {
		t.Fatal(err)
	}
	const sub = "no-kek"
	p := projection.New(sub, reg)
	projection.On(p, func(context.Context, pgx.Tx, eventstore.Envelope[customer]) error { return nil })
	run := h.newRunner(projection.RetryPolicy{MaxRetries: 3}, -1, failReg{p, nil})
	if err := run.catchUp(); err != nil {
		t.Fatalf("RunUntilCaughtUp: %v\n%s", err, h.dump())
	}
	dls := h.deadLetters(sub)
	if len(dls) != 1 || dls[0].EventID != res.Events[0].ID || dls[0].Attempts != 1 ||
		!strings.Contains(dls[0].Error, "personal fields are encrypted") {
		t.Fatalf("dead letters %v (%q), want one for the encrypted event after one attempt\n%s", dls, dls, h.dump())
	}
	if got := run.clock.requested(); len(got) != 0 {
		t.Errorf("waited %v before dead-lettering an event encrypted for want of a KEK", got)
	}
}
