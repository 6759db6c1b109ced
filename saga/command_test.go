package saga_test

import (
	"context"
	stderrors "errors"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

// The order domain of these tests: an Order aggregate with rules (no payment
// after cancellation, no cancellation after payment), and a saga that
// cancels an order whose payment deadline passes, through the aggregate.
type OrderPlaced struct {
	Total int `json:"total"`
}

type OrderPaid struct{}

type OrderCancelled struct {
	Reason string `json:"reason"`
}

type PaymentDue struct {
	OrderID string `json:"order_id"`
}

type Order struct {
	aggregate.Base
	Paid      bool `json:"paid"`
	Cancelled bool `json:"cancelled"`
	Notes     int  `json:"notes"`
}

type OrderNoted struct{}

var (
	errAlreadyPaid = stderrors.New("order: already paid")
	errCancelled   = stderrors.New("order: cancelled")
)

func (o *Order) Apply(event any) error {
	switch event.(type) {
	case OrderPlaced:
	case OrderPaid:
		o.Paid = true
	case OrderCancelled:
		o.Cancelled = true
	case OrderNoted:
		o.Notes++
	default:
		return aggregate.ErrUnhandledEvent
	}
	return nil
}

func (o *Order) Pay() error {
	if o.Cancelled {
		return errCancelled
	}
	return aggregate.Record(o, OrderPaid{})
}

func (o *Order) Cancel(reason string) error {
	if o.Paid {
		return errAlreadyPaid
	}
	if o.Cancelled {
		return nil
	}
	return aggregate.Record(o, OrderCancelled{Reason: reason})
}

func (o *Order) Note() error { return aggregate.Record(o, OrderNoted{}) }

type orderSagaState struct {
	Outcome string `json:"outcome"`
}

type orderFixture struct {
	*bundle
	orders *aggregate.Repository[*Order]
	clock  *fakeClock
	sched  *scheduler.Scheduler
	run    func()
}

// setupOrders registers the order saga: an OrderPlaced schedules PaymentDue
// in 15 minutes; PaymentDue cancels the order through the aggregate (the
// saga does not follow payments: the aggregate's rule refuses to cancel a
// paid order). beforeSave, if set, runs inside the saga's command, between
// the load and the save.
func setupOrders(t *testing.T, beforeSave func(o *Order) error) orderFixture {
	t.Helper()
	b := setup(t)
	eventstore.MustRegister[OrderPlaced](b.reg, "order.placed")
	eventstore.MustRegister[OrderPaid](b.reg, "order.paid")
	eventstore.MustRegister[OrderCancelled](b.reg, "order.cancelled")
	eventstore.MustRegister[OrderNoted](b.reg, "order.noted")
	eventstore.MustRegister[PaymentDue](b.reg, "order.payment_due")
	orders, err := aggregate.NewRepository(b.store, "order", func() *Order { return &Order{} }, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
	sched, err := scheduler.New(b.store, &scheduler.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	s := saga.New[orderSagaState]("payment-deadline", b.reg)
	saga.On(s, func(e eventstore.Envelope[OrderPlaced]) string { return e.StreamID },
		func(ctx context.Context, inst *saga.Instance[orderSagaState], e eventstore.Envelope[OrderPlaced]) error {
			_, err := inst.ScheduleAfter(ctx, 15*time.Minute, "deadlines", eventstore.NewEvent(PaymentDue{OrderID: e.StreamID}))
			return err
		})
	saga.On(s, func(e eventstore.Envelope[PaymentDue]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[orderSagaState], e eventstore.Envelope[PaymentDue]) error {
			id := e.Data.OrderID[len("order-"):]
			_, err := saga.Update(ctx, inst, orders, id, func(o *Order) error {
				if beforeSave != nil {
					if err := beforeSave(o); err != nil {
						return err
					}
				}
				return o.Cancel("payment overdue")
			})
			switch {
			case errors.Is(err, errAlreadyPaid):
				inst.State.Outcome = "paid in time"
			case err != nil:
				return err
			default:
				inst.State.Outcome = "cancelled"
			}
			inst.Complete()
			return nil
		})
	r := b.runner(t)
	if err := saga.Register(r, s, &saga.Config{Store: b.store, Scheduler: sched, Clock: clock}); err != nil {
		t.Fatal(err)
	}
	return orderFixture{bundle: b, orders: orders, clock: clock, sched: sched, run: func() { catchUp(t, r) }}
}

func (f orderFixture) place(t *testing.T, id string) {
	t.Helper()
	if _, err := f.orders.Create(t.Context(), id, func(o *Order) error { return aggregate.Record(o, OrderPlaced{Total: 10}) }); err != nil {
		t.Fatal(err)
	}
}

// expire moves past the deadline, fires it and runs the saga.
func (f orderFixture) expire(t *testing.T) {
	t.Helper()
	f.clock.Advance(16 * time.Minute)
	n, err := f.sched.FireDue(t.Context())
	if err != nil || n == 0 {
		t.Fatalf("fired %d timers: %v", n, err)
	}
	f.run()
}

func (f orderFixture) outcome(t *testing.T, id string) string {
	t.Helper()
	st, err := saga.Lookup[orderSagaState](t.Context(), f.db.Pool, "", "payment-deadline", "order-"+id)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Completed {
		t.Fatalf("saga instance of order %s not completed: %+v", id, st)
	}
	return st.State.Outcome
}

func TestSagaCommandsAggregates(t *testing.T) {
	t.Parallel()

	t.Run("DeadlineCancelsTheUnpaidOrder", func(t *testing.T) {
		t.Parallel()
		f := setupOrders(t, nil)
		f.place(t, "1")
		f.run()
		f.expire(t)
		if got := f.outcome(t, "1"); got != "cancelled" {
			t.Fatalf("outcome %q, want cancelled", got)
		}
		o, err := f.orders.Load(t.Context(), "1")
		if err != nil || !o.Cancelled || o.Version() != 2 {
			t.Fatalf("order after the deadline: %+v, %v; want cancelled at version 2", o, err)
		}
		// The cancellation names the deadline event as its cause.
		var cause, due string
		if err := f.db.Pool.QueryRow(t.Context(), `SELECT
				(SELECT metadata->>'causation_id' FROM annals.events WHERE event_type = 'order.cancelled'),
				(SELECT event_id::text FROM annals.events WHERE event_type = 'order.payment_due')`).Scan(&cause, &due); err != nil || cause != due {
			t.Fatalf("the cancellation's cause is %q, want the deadline %q (%v)", cause, due, err)
		}
		// The aggregate's rules now hold for everybody: no payment.
		if _, err := f.orders.Update(t.Context(), "1", (*Order).Pay); !errors.Is(err, errCancelled) {
			t.Fatalf("payment of a cancelled order: %v, want errCancelled", err)
		}
	})

	t.Run("RuleRefusesToCancelAPaidOrder", func(t *testing.T) {
		t.Parallel()
		f := setupOrders(t, nil)
		f.place(t, "2")
		f.run()
		// Paid by the customer; the saga does not see payments.
		if _, err := f.orders.Update(t.Context(), "2", (*Order).Pay); err != nil {
			t.Fatal(err)
		}
		f.expire(t)
		if got := f.outcome(t, "2"); got != "paid in time" {
			t.Fatalf("outcome %q, want the refusal", got)
		}
		o, err := f.orders.Load(t.Context(), "2")
		if err != nil || !o.Paid || o.Cancelled || o.Version() != 2 {
			t.Fatalf("order %+v (%v): a paid order must not be cancelled", o, err)
		}
	})

	t.Run("ConflictIsRetriedExactlyOnce", func(t *testing.T) {
		t.Parallel()
		// While the saga's command runs (after its load, before its save),
		// another writer notes the order: the save conflicts, the runner
		// rolls the event back and retries it, and the retry loads the note.
		var f orderFixture
		attempts := 0
		f = setupOrders(t, func(o *Order) error {
			attempts++
			if attempts == 1 {
				_, err := f.orders.Update(context.Background(), o.ID(), (*Order).Note)
				return err
			}
			return nil
		})
		f.place(t, "3")
		f.run()
		f.expire(t)
		if attempts != 2 {
			t.Fatalf("the saga's command ran %d times, want 2 (a conflict, then the retry)", attempts)
		}
		o, err := f.orders.Load(t.Context(), "3")
		if err != nil || !o.Cancelled || o.Notes != 1 || o.Version() != 3 {
			t.Fatalf("order %+v (%v); want placed, noted, cancelled once", o, err)
		}
		if n := f.count(t, `SELECT count(*) FROM annals.dead_letters`); n != 0 {
			t.Fatalf("%d dead letters", n)
		}
		if got := f.outcome(t, "3"); got != "cancelled" {
			t.Fatalf("outcome %q", got)
		}
	})

	t.Run("CommandsRollBackWithTheHandler", func(t *testing.T) {
		t.Parallel()
		// The first attempt at each event commands the Tally and then fails:
		// the tally's events roll back with it.
		b := setup(t)
		tally := tallies(t, b.store)
		r := b.runner(t)
		register(t, r, &failOnce{Saga: tallySaga(b.reg, 0, tally), seen: map[string]bool{}}, &saga.Config{Store: b.store})
		for i := range 3 {
			b.append(t, "orders", Added{ID: "t", N: i + 1})
		}
		catchUp(t, r)
		agg, err := tally.Load(t.Context(), "t")
		if err != nil || agg.Count != 3 || agg.Sum != 6 || agg.Version() != 3 {
			t.Fatalf("tally %+v (%v); want 3 additions summing to 6", agg, err)
		}
	})
}
