package main

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/scheduler"
)

// reply appends a service's reply to a request. Observers are delivered
// at least once, so the reply's ID is derived from the request's: appending
// it again is a no-op.
func reply(ctx context.Context, store *eventstore.Store, req eventstore.Event, data any) error {
	_, err := store.Append(ctx, req.StreamID, eventstore.Any, replyTo(req, data))
	return err
}

// replyTo is the reply to req: its ID derived from req's, its causation req.
func replyTo(req eventstore.Event, data any) eventstore.EventData {
	return eventstore.EventData{
		ID:       uuid.NewSHA1(req.ID, []byte("reply")),
		Data:     data,
		Metadata: eventstore.Metadata{CausationID: req.ID.String(), CorrelationID: req.Metadata.CorrelationID},
	}
}

// stockService simulates a warehouse with 10 widgets. (Its stock is kept in
// memory, which a real service would not do.)
func stockService(reg *eventstore.Registry, store *eventstore.Store) *projection.TypedObserver {
	var mu sync.Mutex
	stock := map[string]int{"widget": 10}
	reserved := map[string]int{}
	o := projection.NewObserver("stock-service", reg)
	projection.Observe(o, func(ctx context.Context, e eventstore.Envelope[ReserveStock]) error {
		mu.Lock()
		ok := stock[e.Data.SKU] >= e.Data.Qty
		if ok {
			stock[e.Data.SKU] -= e.Data.Qty
			reserved[e.Data.OrderID] = e.Data.Qty
		}
		mu.Unlock()
		if !ok {
			return reply(ctx, store, e.Event, StockUnavailable{OrderID: e.Data.OrderID})
		}
		return reply(ctx, store, e.Event, StockReserved{OrderID: e.Data.OrderID})
	})
	projection.Observe(o, func(ctx context.Context, e eventstore.Envelope[ReleaseStock]) error {
		mu.Lock()
		defer mu.Unlock()
		stock["widget"] += reserved[e.Data.OrderID]
		delete(reserved, e.Data.OrderID)
		return nil
	})
	return o
}

// paymentService simulates a payment provider: bob's card is declined,
// carol never pays, erin pays late (her payment is settled LatePayment after
// the request, past the saga's deadline: a delayed append kept by the
// scheduler), everyone else pays at once. Each payment gets exactly
// one final answer: CancelPayment of a payment it has not settled answers
// PaymentCancelled, of a settled one nothing. (It keeps the unsettled
// payments in memory, which a real service would not do.)
func paymentService(reg *eventstore.Registry, store *eventstore.Store, sched *scheduler.Scheduler) *projection.TypedObserver {
	var mu sync.Mutex
	unsettled := map[string]bool{}
	o := projection.NewObserver("payment-service", reg)
	projection.Observe(o, func(ctx context.Context, e eventstore.Envelope[RequestPayment]) error {
		switch e.Data.Customer {
		case "bob":
			return reply(ctx, store, e.Event, PaymentFailed{OrderID: e.Data.OrderID, Reason: "card declined"})
		case "erin":
			// The reply's ID is derived from the request's, so a
			// re-delivery schedules a timer whose append is a no-op.
			_, err := sched.Schedule(ctx, nil, time.Now().Add(LatePayment), e.StreamID, replyTo(e.Event, PaymentReceived{OrderID: e.Data.OrderID}))
			return err
		case "carol":
			mu.Lock()
			unsettled[e.Data.OrderID] = true // no answer: the saga's deadline will pass
			mu.Unlock()
			return nil
		default:
			return reply(ctx, store, e.Event, PaymentReceived{OrderID: e.Data.OrderID})
		}
	})
	projection.Observe(o, func(ctx context.Context, e eventstore.Envelope[CancelPayment]) error {
		mu.Lock()
		defer mu.Unlock()
		if !unsettled[e.Data.OrderID] {
			return nil // settled already: its answer is in the log
		}
		if err := reply(ctx, store, e.Event, PaymentCancelled{OrderID: e.Data.OrderID}); err != nil {
			return err // still unsettled: a retry answers
		}
		delete(unsettled, e.Data.OrderID)
		return nil
	})
	return o
}
