package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

// PaymentDeadline is how long the saga waits for a payment. Short, for a demo.
const PaymentDeadline = time.Second

// LatePayment is when erin's payment arrives: after the deadline.
const LatePayment = 2 * PaymentDeadline

// Events on "order-<id>".
type (
	OrderPlaced struct {
		OrderID  string `json:"order_id"`
		Customer string `json:"customer"`
		SKU      string `json:"sku"`
		Qty      int    `json:"qty"`
		Amount   int    `json:"amount"`
	}
	PaymentDeadlinePassed struct {
		OrderID string `json:"order_id"`
	}
	OrderCompleted struct {
		OrderID string `json:"order_id"`
	}
	OrderCancelled struct {
		OrderID string `json:"order_id"`
		Reason  string `json:"reason"`
	}
)

// Events on "stock-<id>": the saga's requests and the stock service's replies.
type (
	ReserveStock struct {
		OrderID string `json:"order_id"`
		SKU     string `json:"sku"`
		Qty     int    `json:"qty"`
	}
	StockReserved struct {
		OrderID string `json:"order_id"`
	}
	StockUnavailable struct {
		OrderID string `json:"order_id"`
	}
	ReleaseStock struct {
		OrderID string `json:"order_id"`
	}
)

// Events on "payment-<id>".
type (
	RequestPayment struct {
		OrderID  string `json:"order_id"`
		Customer string `json:"customer"`
		Amount   int    `json:"amount"`
	}
	PaymentReceived struct {
		OrderID string `json:"order_id"`
	}
	PaymentFailed struct {
		OrderID string `json:"order_id"`
		Reason  string `json:"reason"`
	}
	// CancelPayment asks the payment service not to take the money. It
	// answers PaymentCancelled, or, if it settled the payment before,
	// nothing more (its PaymentReceived or PaymentFailed is on the way).
	CancelPayment struct {
		OrderID string `json:"order_id"`
	}
	PaymentCancelled struct {
		OrderID string `json:"order_id"`
	}
	RefundPayment struct {
		OrderID string `json:"order_id"`
		Amount  int    `json:"amount"`
	}
)

func registry() *eventstore.Registry {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[OrderPlaced](reg, "order.placed")
	eventstore.MustRegister[PaymentDeadlinePassed](reg, "order.payment_deadline_passed")
	eventstore.MustRegister[OrderCompleted](reg, "order.completed")
	eventstore.MustRegister[OrderCancelled](reg, "order.cancelled")
	eventstore.MustRegister[ReserveStock](reg, "stock.reserve")
	eventstore.MustRegister[StockReserved](reg, "stock.reserved")
	eventstore.MustRegister[StockUnavailable](reg, "stock.unavailable")
	eventstore.MustRegister[ReleaseStock](reg, "stock.release")
	eventstore.MustRegister[RequestPayment](reg, "payment.request")
	eventstore.MustRegister[PaymentReceived](reg, "payment.received")
	eventstore.MustRegister[PaymentFailed](reg, "payment.failed")
	eventstore.MustRegister[CancelPayment](reg, "payment.cancel")
	eventstore.MustRegister[PaymentCancelled](reg, "payment.cancelled")
	eventstore.MustRegister[RefundPayment](reg, "payment.refund")
	return reg
}

// OrderState is the saga's state per order.
type OrderState struct {
	Amount int `json:"amount"`
	// Stock is the stock service's answer: "", answerReserved or answerUnavailable.
	Stock string `json:"stock"`
	// Payment is the payment service's final answer: "", answerPaid,
	// answerFailed (PaymentError says why) or answerCancelled.
	Payment      string `json:"payment"`
	PaymentError string `json:"payment_error,omitempty"`
	// Deadline is the payment deadline's timer; TimedOut says it passed
	// before the payment service answered.
	Deadline scheduler.TimerID `json:"deadline"`
	TimedOut bool              `json:"timed_out"`
	// Cancelled says OrderCancelled was appended; Released and Refunded
	// that the stock and the payment were compensated.
	Cancelled bool   `json:"cancelled"`
	Released  bool   `json:"released"`
	Refunded  bool   `json:"refunded"`
	Outcome   string `json:"outcome"`
}

// The services' answers, as OrderState records them.
const (
	answerReserved    = "reserved"
	answerUnavailable = "unavailable"
	answerPaid        = "paid"
	answerFailed      = "failed"
	answerCancelled   = "cancelled"
)

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatalf("ordersaga: %v", err)
	}
}

func run(ctx context.Context) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("set DATABASE_URL (or run `annals dev`, which starts a throwaway PostgreSQL)")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	reg := registry()
	client, err := annals.New(pool, &annals.Config{Registry: reg,
		Runner: &projection.Config{PollInterval: 100 * time.Millisecond}})
	if err != nil {
		return err
	}
	// The saga (its timers go to the client's scheduler), and the simulated
	// services beside it.
	if err := annals.AddSaga(client, orderSaga(reg), nil); err != nil {
		return err
	}
	if err := annals.AddObserver(client, stockService(reg, client.Store()), nil); err != nil {
		return err
	}
	if err := annals.AddObserver(client, paymentService(reg, client.Store(), client.Scheduler()), nil); err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil { // migrates, then runs in the background
		return err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()

	// Four orders; the customer decides how the payment goes, the quantity
	// whether the stock suffices. A run ID keeps runs apart in one database.
	run := runID()
	orders := []struct {
		OrderPlaced
		want string
	}{
		{OrderPlaced{Customer: "alice", SKU: "widget", Qty: 2, Amount: 40}, "completed"},
		{OrderPlaced{Customer: "bob", SKU: "widget", Qty: 1, Amount: 20}, "cancelled: payment failed (card declined)"},
		{OrderPlaced{Customer: "carol", SKU: "widget", Qty: 1, Amount: 20}, "cancelled: payment deadline passed"},
		{OrderPlaced{Customer: "erin", SKU: "widget", Qty: 1, Amount: 30}, "cancelled: payment deadline passed, payment refunded"},
		{OrderPlaced{Customer: "dave", SKU: "widget", Qty: 100, Amount: 2000}, "cancelled: out of stock, payment refunded"},
	}
	fmt.Printf("placing %d orders (run %s); the payment deadline is %v\n", len(orders), run, PaymentDeadline)
	for i := range orders {
		o := &orders[i].OrderPlaced
		o.OrderID = fmt.Sprintf("%s-%d", run, i+1)
		if _, err := client.Append(ctx, "order-"+o.OrderID, eventstore.NoStream, eventstore.NewEvent(*o)); err != nil {
			return err
		}
		fmt.Printf("  order %s: %s buys %d × %s for %d\n", o.OrderID, o.Customer, o.Qty, o.SKU, o.Amount)
	}

	// Wait for every order's saga to complete.
	start := time.Now()
	for i := range orders {
		id := orders[i].OrderID
		for {
			st, err := saga.Lookup[OrderState](ctx, pool, client.Schema(), sagaName, id)
			if err == nil && st.Completed {
				break
			}
			if err != nil && !errors.Is(err, saga.ErrNotFound) {
				return err
			}
			select {
			case <-ctx.Done():
				return errors.Wrapf(ctx.Err(), "order %s did not finish", id)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	fmt.Printf("\nall sagas completed after %v. What happened, per order, in log order:\n", time.Since(start).Round(100*time.Millisecond))
	history := map[string][]string{}
	for e, err := range client.ReadAll(ctx, 0) {
		if err != nil {
			return err
		}
		_, id, ok := strings.Cut(e.StreamID, "-")
		if !ok || !strings.HasPrefix(id, run+"-") {
			continue
		}
		history[id] = append(history[id], fmt.Sprintf("%-12s %-30s %s", e.StreamID[:strings.IndexByte(e.StreamID, '-')], e.Type, e.Data))
	}
	ids := make([]string, 0, len(history))
	for id := range history {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var wrong []string
	for i, id := range ids {
		st, err := saga.Lookup[OrderState](ctx, pool, client.Schema(), sagaName, id)
		if err != nil {
			return err
		}
		outcome := st.State.Outcome
		if st.State.Refunded {
			outcome += ", payment refunded"
		}
		fmt.Printf("\norder %s (%s): %s\n", id, orders[i].Customer, outcome)
		for _, line := range history[id] {
			fmt.Println("  " + line)
		}
		if outcome != orders[i].want {
			wrong = append(wrong, fmt.Sprintf("order %s: %q, want %q", id, outcome, orders[i].want))
		}
	}
	if len(wrong) > 0 {
		return errors.Newf("unexpected outcomes:\n%s", strings.Join(wrong, "\n"))
	}
	return nil
}

func runID() string {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
