package main

import (
	"context"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/saga"
)

const sagaName = "order-fulfilment"

// orderSaga returns the order-fulfilment saga: one instance per order ID.
//
// The process, from the saga's side: it asks the stock service to reserve
// the goods and the payment service to take the money, and sets a payment
// deadline. Each service gives exactly one final answer per order: stock
// reserved or unavailable; payment received, failed, or (only after the
// saga sent CancelPayment) cancelled. Every handler records the answer it
// got in the state and calls decide, which:
//
//   - completes the order when the stock is reserved and the payment
//     received, in time;
//   - cancels it when the stock is unavailable, the payment failed, or the
//     deadline passed before the payment service answered. Cancelling asks
//     the payment service to cancel a payment it has not answered yet;
//   - once cancelled, compensates every success, whenever it arrives:
//     releases reserved stock and refunds a received payment (a payment can
//     still arrive after the deadline: the payment service may have taken
//     the money before it saw CancelPayment);
//   - ends the instance only when both services have answered, so that no
//     answer arrives at a completed instance, where it would be ignored.
//
// A cancelled order is never completed. Everything a handler does (state,
// appended events, timers) commits together with the saga's checkpoint,
// exactly once.
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

	// The stock service's answer.
	saga.On(s, func(e eventstore.Envelope[StockReserved]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[StockReserved]) error {
			inst.State.Stock = answerReserved
			return decide(ctx, inst)
		})
	saga.On(s, func(e eventstore.Envelope[StockUnavailable]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[StockUnavailable]) error {
			inst.State.Stock = answerUnavailable
			return decide(ctx, inst)
		})

	// The payment service's answer.
	saga.On(s, func(e eventstore.Envelope[PaymentReceived]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[PaymentReceived]) error {
			return paymentAnswered(ctx, inst, answerPaid, "")
		})
	saga.On(s, func(e eventstore.Envelope[PaymentFailed]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[PaymentFailed]) error {
			return paymentAnswered(ctx, inst, answerFailed, e.Data.Reason)
		})
	saga.On(s, func(e eventstore.Envelope[PaymentCancelled]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[PaymentCancelled]) error {
			return paymentAnswered(ctx, inst, answerCancelled, "")
		})

	saga.On(s, func(e eventstore.Envelope[PaymentDeadlinePassed]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[PaymentDeadlinePassed]) error {
			if inst.State.Payment != "" || inst.State.Cancelled {
				// The payment's answer or the cancellation came first, and
				// the timer fired while they cancelled it (Cancel never
				// waits): the deadline no longer matters.
				return nil
			}
			inst.State.TimedOut = true
			return decide(ctx, inst)
		})
	return s
}

// paymentAnswered records the payment service's final answer. The deadline
// no longer matters: it is cancelled (if it is firing right now, its event
// arrives and is ignored).
func paymentAnswered(ctx context.Context, inst *saga.Instance[OrderState], answer, reason string) error {
	st := &inst.State
	if st.Payment != "" {
		return nil // one final answer per payment; a redelivered duplicate changes nothing
	}
	st.Payment, st.PaymentError = answer, reason
	if _, err := inst.Cancel(ctx, st.Deadline); err != nil {
		return err
	}
	return decide(ctx, inst)
}

// decide moves the order on from what the state knows. See orderSaga.
func decide(ctx context.Context, inst *saga.Instance[OrderState]) error {
	st, id := &inst.State, inst.ID()
	if !st.Cancelled {
		var reason string
		switch {
		case st.Stock == answerReserved && st.Payment == answerPaid:
			st.Outcome = "completed"
			if _, err := inst.Append(ctx, "order-"+id, eventstore.Any, eventstore.NewEvent(OrderCompleted{OrderID: id})); err != nil {
				return err
			}
			inst.Complete()
			return nil
		case st.Stock == answerUnavailable:
			reason = "out of stock"
		case st.Payment == answerFailed:
			reason = "payment failed (" + st.PaymentError + ")"
		case st.Payment == answerCancelled:
			reason = "payment cancelled" // by the payment service, unasked
		case st.TimedOut:
			reason = "payment deadline passed"
		default:
			return nil // wait for more answers
		}
		if err := cancelOrder(ctx, inst, reason); err != nil {
			return err
		}
	}
	// The order is cancelled: undo what succeeded, as the answers arrive.
	if st.Stock == answerReserved && !st.Released {
		st.Released = true
		if _, err := inst.Append(ctx, "stock-"+id, eventstore.Any, eventstore.NewEvent(ReleaseStock{OrderID: id})); err != nil {
			return err
		}
	}
	if st.Payment == answerPaid && !st.Refunded {
		st.Refunded = true
		if _, err := inst.Append(ctx, "payment-"+id, eventstore.Any, eventstore.NewEvent(RefundPayment{OrderID: id, Amount: st.Amount})); err != nil {
			return err
		}
	}
	if st.Stock != "" && st.Payment != "" {
		inst.Complete() // both services have answered: nothing left to wait for or compensate
	}
	return nil
}

// cancelOrder cancels the order once: it appends OrderCancelled, cancels
// the payment deadline, and, if the payment service has not answered,
// asks it to cancel the payment. The service then answers PaymentCancelled,
// or PaymentReceived/PaymentFailed if it settled the payment first.
func cancelOrder(ctx context.Context, inst *saga.Instance[OrderState], reason string) error {
	st, id := &inst.State, inst.ID()
	st.Cancelled, st.Outcome = true, "cancelled: "+reason
	if _, err := inst.Append(ctx, "order-"+id, eventstore.Any, eventstore.NewEvent(OrderCancelled{OrderID: id, Reason: reason})); err != nil {
		return err
	}
	if _, err := inst.Cancel(ctx, st.Deadline); err != nil {
		return err
	}
	if st.Payment == "" {
		if _, err := inst.Append(ctx, "payment-"+id, eventstore.Any, eventstore.NewEvent(CancelPayment{OrderID: id})); err != nil {
			return err
		}
	}
	return nil
}
