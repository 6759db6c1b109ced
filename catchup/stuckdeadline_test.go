package catchup_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
)

// stuckDeadliner is nopProcessor with an IdleDeadliner that breaks the
// contract: after each successful Idle its NextIdle is still a time long
// past. It records when Idle is called.
type stuckDeadliner struct {
	nopProcessor
	mu    sync.Mutex
	calls []time.Time
}

func (p *stuckDeadliner) Idle(context.Context, *catchup.Lease) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, time.Now())
	return nil
}

func (p *stuckDeadliner) NextIdle() time.Time { return time.Unix(1, 0) }

func (p *stuckDeadliner) idled() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.calls...)
}

// TestIdleDeadlineThatNeverMoves: a processor whose NextIdle stays in the
// past after a successful Idle is called again after RetryBackoff, not after
// a millisecond: each idle wake is followed by a read, and the floor of 1 ms
// made that about a thousand reads a second per partition.
func TestIdleDeadlineThatNeverMoves(t *testing.T) {
	t.Parallel()
	const backoff = 100 * time.Millisecond
	db := annalstest.NewDB(t, nil)
	e, err := catchup.NewEngine(db.Pool, nil, &catchup.Config{PollInterval: time.Minute, RetryBackoff: backoff})
	if err != nil {
		t.Fatal(err)
	}
	p := &stuckDeadliner{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx, &catchup.Subscription{Name: "stuck", Processor: p}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	const n = 6
	annalstest.WaitFor(t, 30*time.Second, func() bool { return len(p.idled()) >= n })
	calls := p.idled()
	// The first wait may be short (a deadline that just came due); every
	// one after it, once the deadline was seen not to move, lasts
	// RetryBackoff (the timer never ends sooner).
	if gap := calls[n-1].Sub(calls[1]); gap < (n-2)*backoff {
		t.Fatalf("%d idle waits after the second took %v: the idle loop spins on a deadline that does not move (want at least %v)", n-2, gap, (n-2)*backoff)
	}
}
