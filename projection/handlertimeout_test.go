package projection_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// deadlineObserver records how long each call had before its context's
// deadline, then works for a while.
type deadlineObserver struct {
	work time.Duration
	mu   sync.Mutex
	left []time.Duration
}

func (o *deadlineObserver) Name() string { return "deadlines" }

func (o *deadlineObserver) Handle(ctx context.Context, _ eventstore.Event) error {
	d, ok := ctx.Deadline()
	o.mu.Lock()
	if ok {
		o.left = append(o.left, time.Until(d))
	} else {
		o.left = append(o.left, -1)
	}
	o.mu.Unlock()
	time.Sleep(o.work) // the handler's own work, not a wait for a condition
	return nil
}

// Handlers of one batch share a timeout context (one per event was the
// largest per-event cost of catch-up), but each call still gets at least
// HandlerTimeout, and at most 1% more: a call late in a batch is not cut
// short by the time its batch-mates took.
func TestHandlerTimeoutPerCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for range 4 {
		if _, err := b.store.Append(ctx, "deadline-1", eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
			t.Fatal(err)
		}
	}
	const timeout = 300 * time.Millisecond
	o := &deadlineObserver{work: 120 * time.Millisecond} // 4 calls: 480 ms > timeout
	r, err := projection.NewRunner(b.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(o, &projection.Options{HandlerTimeout: timeout}); err != nil {
		t.Fatal(err)
	}
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if len(o.left) != 4 {
		t.Fatalf("%d calls, want 4", len(o.left))
	}
	for i, left := range o.left {
		// Measured at the call's start, a moment after the deadline was set
		// (generously: a busy machine may deschedule the goroutine between;
		// a context shared without renewal would leave the third call 60 ms).
		if left < timeout-50*time.Millisecond || left > timeout+timeout/100+time.Millisecond {
			t.Errorf("call %d had %v before its deadline, want %v to %v", i+1, left, timeout, timeout+timeout/100)
		}
	}
}
