package main

import (
	"context"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/saga"
)

const sagaName = "order-fulfilment"

// orderSaga returns the order-fulfilment saga: one instance per order ID.
// Every handler records what it learnt in the state and calls decide.
// Everything a handler does (state, appended events, the timer) commits
// together with the saga's checkpoint, exactly once.
func orderSaga(reg *eventstore.Registry) *saga.Typed[OrderState] {
	s := saga.New[OrderState](sagaName, reg)

	saga.On(s, func(e eventstore.Envelope[OrderPlaced]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[OrderPlaced]) error {
			o := e.Data
			inst.State.Amount = o.Amount
			if _, err := inst.Append(ctx, "stock-"+o.OrderID, eventstore.NoStream,
				eventstore.NewEvent(ReserveStock{OrderID: o.OrderID, SKU: o.SKU, Qty: o.Qty})); err != nil {
				return err
			}
			if _, err := inst.Append(ctx, "payment-"+o.OrderID, eventstore.NoStream,
				eventstore.NewEvent(RequestPayment{OrderID: o.OrderID, Customer: o.Customer, Amount: o.Amount})); err != nil {
				return err
			}
			// The deadline is an event the scheduler appends to the order's
			// stream when it is due, unless it is cancelled before.
			id, err := inst.ScheduleAfter(ctx, PaymentDeadline, "order-"+o.OrderID,
				eventstore.NewEvent(PaymentDeadlinePassed{OrderID: o.OrderID}))
			inst.State.Deadline = id
			return err
		})

	saga.On(s, func(e eventstore.Envelope[StockReserved]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[StockReserved]) error {
			inst.State.Stock = "reserved"
			return decide(ctx, inst)
		})
	saga.On(s, func(e eventstore.Envelope[StockUnavailable]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[StockUnavailable]) error {
			inst.State.Stock = "unavailable"
			return decide(ctx, inst)
		})

	saga.On(s, func(e eventstore.Envelope[PaymentReceived]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[PaymentReceived]) error {
			inst.State.Payment = "paid"
			// The deadline no longer matters. Cancel never waits: if the timer
			// is firing right now, its event arrives and is ignored below.
			if _, err := inst.Cancel(ctx, inst.State.Deadline); err != nil {
				return err
			}
			return decide(ctx, inst)
		})
	saga.On(s, func(e eventstore.Envelope[PaymentFailed]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[PaymentFailed]) error {
			inst.State.Payment = "failed (" + e.Data.Reason + ")"
			if _, err := inst.Cancel(ctx, inst.State.Deadline); err != nil {
				return err
			}
			return decide(ctx, inst)
		})
	saga.On(s, func(e eventstore.Envelope[PaymentDeadlinePassed]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[PaymentDeadlinePassed]) error {
			if inst.State.Payment != "" {
				return nil // the payment's reply came first
			}
			inst.State.Payment = "timed out"
			// Tell the payment service not to take the money any more.
			if _, err := inst.Append(ctx, "payment-"+inst.ID(), eventstore.Any,
				eventstore.NewEvent(CancelPayment{OrderID: inst.ID()})); err != nil {
				return err
			}
			return decide(ctx, inst)
		})
	return s
}

// decide moves the order on from what the state knows: complete it when the
// stock is reserved and the payment received; cancel it when either fails,
// and compensate what succeeded. The instance completes once both services
// have answered (or the payment timed out), so that a reply that arrives
// after the cancellation is still compensated.
func decide(ctx context.Context, inst *saga.Instance[OrderState]) error {
	st, id := &inst.State, inst.ID()
	failed := st.Stock == "unavailable" || (st.Payment != "" && st.Payment != "paid")
	switch {
	case st.Stock == "reserved" && st.Payment == "paid":
		st.Outcome = "completed"
		if _, err := inst.Append(ctx, "order-"+id, eventstore.Any, eventstore.NewEvent(OrderCompleted{OrderID: id})); err != nil {
			return err
		}
		inst.Complete()
	case failed:
		if !st.Cancelled {
			reason := "out of stock"
			if st.Stock != "unavailable" {
				reason = "payment " + st.Payment
				if st.Payment == "timed out" {
					reason = "payment deadline passed"
				}
			}
			st.Cancelled, st.Outcome = true, "cancelled: "+reason
			if _, err := inst.Append(ctx, "order-"+id, eventstore.Any, eventstore.NewEvent(OrderCancelled{OrderID: id, Reason: reason})); err != nil {
				return err
			}
		}
		if st.Stock == "reserved" && !st.Released {
			st.Released = true
			if _, err := inst.Append(ctx, "stock-"+id, eventstore.Any, eventstore.NewEvent(ReleaseStock{OrderID: id})); err != nil {
				return err
			}
		}
		if st.Payment == "paid" && !st.Refunded {
			st.Refunded = true
			if _, err := inst.Append(ctx, "payment-"+id, eventstore.Any, eventstore.NewEvent(RefundPayment{OrderID: id, Amount: st.Amount})); err != nil {
				return err
			}
		}
		if st.Stock != "" && st.Payment != "" {
			inst.Complete() // nothing left to wait for or compensate
		}
	}
	return nil
}
