package catchup

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
)

type nopLeader struct{}

func (nopLeader) Start(context.Context, *Lease) error     { return nil }
func (nopLeader) Redeliver(context.Context, *Lease) error { return nil }
func (nopLeader) Idle(context.Context, *Lease) error      { return nil }
func (nopLeader) End(context.Context, *Lease) error       { return nil }
func (nopLeader) Process(_ context.Context, _ *Lease, b Batch) (int64, error) {
	return b.Through, nil
}

// TakeOver fences the leader even when its own request never shows in
// pg_locks under the PID it looks for (a pooler that reports a made-up
// PID, were pg_backend_pid() to lie too): after takeOverQueuedWait it
// fences anyway, and the takeover completes instead of timing out behind a
// leader that was never told to let go.
func TestTakeOverFencesWhenItsRequestDoesNotShow(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	// Wait for the leader's claim, not only its lock: between the two, a
	// claim that meets TakeOver's layout check on the checkpoint row can
	// time out (under load), and the leader then gives the lock back, which
	// TakeOver takes without a fence.
	var leading atomic.Bool
	var logs annalstest.LogBuffer // the leader's log, shown if the test fails
	leader, err := NewEngine(db.Pool, nil, &Config{Owner: "leader", PollInterval: 20 * time.Millisecond,
		Logger:       slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnLeadership: func(_ string, _ int, _ int64, l bool) { leading.Store(l) }})
	if err != nil {
		t.Fatal(err)
	}
	sub := &Subscription{Name: "s", Processor: nopLeader{}}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- leader.Run(runCtx, sub) }()
	defer func() { stop(); <-ran }()
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		return leading.Load()
	})

	rebuild, err := NewEngine(db.Pool, nil, &Config{Owner: "rebuild"})
	if err != nil {
		t.Fatal(err)
	}
	rebuild.takeOverSeen = func(uint32) uint32 { return 0 } // no backend has PID 0
	start := time.Now()
	lease, err := rebuild.TakeOver(ctx, sub, takeOverQueuedWait+10*time.Second)
	if err != nil {
		t.Fatalf("TakeOver: %+v", err)
	}
	defer rebuild.Release(ctx, lease)
	took := time.Since(start)
	if took < takeOverQueuedWait {
		t.Fatalf("TakeOver took %v, before it could have given up looking for its request (%v); the leader's log:\n%s", took, takeOverQueuedWait, logs.String())
	}
	t.Logf("TakeOver took %v", took)
}
