package projection_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
)

// stuckProcessor is a catch-up processor whose Redeliver does nothing and
// returns nil, as the NATS relay's and annals tail's do: it cannot settle
// released dead letters. It records when Redeliver is called.
type stuckProcessor struct {
	mu    sync.Mutex
	calls []time.Time
}

func (*stuckProcessor) Start(context.Context, *catchup.Lease) error { return nil }
func (*stuckProcessor) Process(_ context.Context, _ *catchup.Lease, b catchup.Batch) (int64, error) {
	return b.Through, nil
}
func (p *stuckProcessor) Redeliver(context.Context, *catchup.Lease) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, time.Now())
	return nil
}
func (*stuckProcessor) Idle(context.Context, *catchup.Lease) error { return nil }
func (*stuckProcessor) End(context.Context, *catchup.Lease) error  { return nil }

func (p *stuckProcessor) redeliveries() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.calls...)
}

// The engine re-delivers while a batch read counts released dead letters,
// and reads again at once after a re-delivery that returned nil. When the
// re-delivery settles none of them (a processor that cannot re-deliver, as
// the relay's: a released dead letter of its subscriber name, which a
// projection of the same name would write), the count never drains; the
// loop used to re-read and re-deliver at once, for ever (a busy loop on
// the database). It now waits a RetryBackoff between such re-deliveries
// and warns once.
func TestRedeliveryThatSettlesNothingBacksOff(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := store.Append(ctx, "order-1", eventstore.Any, eventstore.EventData{Type: "order.placed", Data: map[string]int{}})
	if err != nil {
		t.Fatal(err)
	}
	const sub = "stuck"
	if _, err := db.Pool.Exec(ctx, `INSERT INTO annals.dead_letters
		(subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error, status)
		VALUES ($1, $2, $3, 'order-1', 'order.placed', 'failed', 'boom', 'retry')`,
		sub, res.Events[0].ID, res.Events[0].GlobalSequence); err != nil {
		t.Fatal(err)
	}
	logs := &failLog{}
	const backoff = 100 * time.Millisecond
	e, err := catchup.NewEngine(db.Pool, nil, &catchup.Config{
		RetryBackoff: backoff, PollInterval: 200 * time.Millisecond, Logger: logs.logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &stuckProcessor{}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(rctx, &catchup.Subscription{Name: sub, Processor: p}) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Run did not return 10 s after its context ended")
			}
		})
	}
	defer stop()
	const n = 5
	annalstest.WaitFor(t, failWait, func() bool { return len(p.redeliveries()) >= n })
	calls := p.redeliveries()[:n]
	// The first two come at once (the first re-delivery may have settled
	// what the read counted); every later one after a RetryBackoff.
	if took, least := calls[n-1].Sub(calls[0]), time.Duration(n-2)*backoff; took < least {
		t.Errorf("%d re-deliveries that settled nothing within %v, want at least %v between the first and the last (a RetryBackoff each)",
			n, took, least)
	}
	stop()
	if w := strings.Count(logs.tail(1<<20), "released dead letters are not being re-delivered"); w != 1 {
		t.Errorf("%d warnings, want 1:\n%s", w, logs.tail(20))
	}
}
