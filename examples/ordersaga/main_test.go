package main

import (
	"context"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/testkit"
)

func TestMain(m *testing.M) { annalstest.Main(m) }

// The example runs against a fresh database and every order ends as its
// scenario says (run checks the outcomes), within its one-minute budget.
func TestOrderSagaRuns(t *testing.T) {
	db := annalstest.NewDB(t, nil)
	t.Setenv("DATABASE_URL", db.URL)
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// effects lists the events the saga (and its timers) appended, as
// "stream type", in log order.
func effects(t *testing.T, r *testkit.SagaReplay[OrderState]) string {
	t.Helper()
	var out []string
	for _, e := range r.Effects(t) {
		out = append(out, e.StreamID+" "+e.Type)
	}
	return strings.Join(out, "\n")
}

// The effects of OrderPlaced, and of the deadline passing with no payment.
const (
	placed   = "stock-1 stock.reserve\npayment-1 payment.request"
	timedOut = "\norder-1 order.payment_deadline_passed\norder-1 order.cancelled\npayment-1 payment.cancel"
)

// The saga's process, event by event, on a fake clock: each step's effects
// exactly, and when the instance completes. Above all: an order cancelled
// at the deadline is never completed, and a payment that arrives after it
// is refunded, whether the stock answered before or after.
func TestOrderSagaProcess(t *testing.T) {
	t.Parallel()
	reg := registry()
	opts := &testkit.SagaReplayOptions{ReplayOptions: testkit.ReplayOptions{Registry: reg}}
	order := testkit.Stream("order-1", OrderPlaced{OrderID: "1", Customer: "carol", SKU: "widget", Qty: 1, Amount: 20})

	// check compares the effects so far and the instance's completion and outcome.
	check := func(t *testing.T, r *testkit.SagaReplay[OrderState], step, want string, completed bool, outcome string) {
		t.Helper()
		if got := effects(t, r); got != want {
			t.Errorf("after %s, effects:\n%s\nwant:\n%s", step, got, want)
		}
		st := r.Instance(t, "1")
		if st.Completed != completed || st.State.Outcome != outcome {
			t.Errorf("after %s: completed %v, outcome %q; want %v, %q (state %+v)", step, st.Completed, st.State.Outcome, completed, outcome, st.State)
		}
	}

	t.Run("LatePaymentBeforeStock", func(t *testing.T) {
		t.Parallel()
		r := testkit.ReplaySaga(t, orderSaga(reg), opts, order)
		check(t, r, "OrderPlaced", placed, false, "")
		if n := r.Advance(t, PaymentDeadline); n != 1 {
			t.Fatalf("%d timers fired at the deadline, want 1", n)
		}
		check(t, r, "the deadline", placed+timedOut, false, "cancelled: payment deadline passed")
		r.Append(t, testkit.Stream("payment-1", PaymentReceived{OrderID: "1"}))
		check(t, r, "a late PaymentReceived", placed+timedOut+"\npayment-1 payment.refund", false, "cancelled: payment deadline passed")
		r.Append(t, testkit.Stream("stock-1", StockReserved{OrderID: "1"}))
		want := placed + timedOut + "\npayment-1 payment.refund\nstock-1 stock.release"
		check(t, r, "StockReserved", want, true, "cancelled: payment deadline passed")
		// Completed: a duplicate answer changes nothing.
		r.Append(t, testkit.Stream("payment-1", PaymentReceived{OrderID: "1"}))
		check(t, r, "a duplicate PaymentReceived", want, true, "cancelled: payment deadline passed")
	})

	t.Run("LatePaymentAfterStock", func(t *testing.T) {
		t.Parallel()
		r := testkit.ReplaySaga(t, orderSaga(reg), opts, order)
		r.Append(t, testkit.Stream("stock-1", StockReserved{OrderID: "1"}))
		check(t, r, "StockReserved", placed, false, "")
		r.Advance(t, PaymentDeadline)
		check(t, r, "the deadline", placed+timedOut+"\nstock-1 stock.release", false, "cancelled: payment deadline passed")
		r.Append(t, testkit.Stream("payment-1", PaymentReceived{OrderID: "1"}))
		check(t, r, "a late PaymentReceived", placed+timedOut+"\nstock-1 stock.release\npayment-1 payment.refund", true, "cancelled: payment deadline passed")
	})

	t.Run("PaymentCancelledAfterDeadline", func(t *testing.T) {
		t.Parallel()
		r := testkit.ReplaySaga(t, orderSaga(reg), opts, order)
		r.Append(t, testkit.Stream("stock-1", StockReserved{OrderID: "1"}))
		r.Advance(t, PaymentDeadline)
		r.Append(t, testkit.Stream("payment-1", PaymentCancelled{OrderID: "1"}))
		check(t, r, "PaymentCancelled", placed+timedOut+"\nstock-1 stock.release", true, "cancelled: payment deadline passed")
	})

	t.Run("PaymentFailedAfterDeadline", func(t *testing.T) {
		t.Parallel()
		r := testkit.ReplaySaga(t, orderSaga(reg), opts, order)
		r.Advance(t, PaymentDeadline)
		r.Append(t, testkit.Stream("payment-1", PaymentFailed{OrderID: "1", Reason: "card declined"}),
			testkit.Stream("stock-1", StockUnavailable{OrderID: "1"}))
		check(t, r, "PaymentFailed and StockUnavailable", placed+timedOut, true, "cancelled: payment deadline passed")
	})

	t.Run("PaidInTime", func(t *testing.T) {
		t.Parallel()
		r := testkit.ReplaySaga(t, orderSaga(reg), opts, order)
		r.Append(t, testkit.Stream("payment-1", PaymentReceived{OrderID: "1"}), testkit.Stream("stock-1", StockReserved{OrderID: "1"}))
		check(t, r, "both answers", placed+"\norder-1 order.completed", true, "completed")
		if ts := r.Timers(t); len(ts) != 0 {
			t.Errorf("timers left: %+v", ts)
		}
		if n := r.Advance(t, 2*PaymentDeadline); n != 0 {
			t.Errorf("%d timers fired after completion", n)
		}
	})

	t.Run("OutOfStockThenPaid", func(t *testing.T) {
		t.Parallel()
		r := testkit.ReplaySaga(t, orderSaga(reg), opts, order)
		r.Append(t, testkit.Stream("stock-1", StockUnavailable{OrderID: "1"}))
		cancelled := placed + "\norder-1 order.cancelled\npayment-1 payment.cancel"
		check(t, r, "StockUnavailable", cancelled, false, "cancelled: out of stock")
		if n := r.Advance(t, 2*PaymentDeadline); n != 0 {
			t.Errorf("the deadline of a cancelled order fired (%d timers)", n)
		}
		r.Append(t, testkit.Stream("payment-1", PaymentReceived{OrderID: "1"}))
		check(t, r, "PaymentReceived", cancelled+"\npayment-1 payment.refund", true, "cancelled: out of stock")
	})
}
