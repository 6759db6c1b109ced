package projection_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// TestShutdownTimeoutExpires: a handler that ignores its context is still
// running ShutdownTimeout after Run's context ended. Run returns anyway,
// within ShutdownTimeout plus a bound, and the next leader re-delivers the
// unfinished batch: every event applied once.
func TestShutdownTimeoutExpires(t *testing.T) {
	t.Parallel()
	h := newLiveHarness(t)
	h.appendEvents(10, 2)

	entered := make(chan struct{})
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock)
	var once sync.Once
	stuck := &seenProjection{name: "seen", before: func(_ context.Context, e eventstore.Event) error {
		if e.GlobalSequence == 5 {
			once.Do(func() {
				close(entered)
				<-release // ignores its context
			})
		}
		return nil
	}}
	const shutdownTimeout = 500 * time.Millisecond
	cfg := testConfig(time.Second)
	cfg.ShutdownTimeout = shutdownTimeout
	r := h.newRunner(cfg, &projection.Options{BatchSize: 10}, stuck)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-entered

	cancel()
	start := time.Now()
	// The bound: after ShutdownTimeout the runner gives the batch 1 s to
	// honour its cancelled context, then abandons it and closes the lock's
	// connection; flushing, deregistering and closing the listener take
	// milliseconds on a database that answers. The other second leaves room
	// for two shared cores.
	const bound = 2 * time.Second
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		t.Logf("Run returned %v after its context ended (ShutdownTimeout %v)", time.Since(start).Round(time.Millisecond), shutdownTimeout)
	case <-time.After(shutdownTimeout + bound):
		t.Fatalf("Run has not returned %v after its context ended (ShutdownTimeout %v)", shutdownTimeout+bound, shutdownTimeout)
	}
	if n := h.seenCount(); n != 0 {
		t.Fatalf("%d events of the unfinished batch were committed", n)
	}
	if cp := h.checkpoint("seen"); cp != 0 {
		t.Fatalf("checkpoint %d after the unfinished batch", cp)
	}

	// The next leader re-delivers the whole batch, while the stuck handler
	// is still stuck.
	next := &seenProjection{name: "seen"}
	stop := h.run(h.newRunner(testConfig(time.Second), &projection.Options{BatchSize: 10}, next))
	h.waitCaughtUp(10*time.Second, "seen")
	stop()
	unblock()
	h.checkSeenIsLog("seen")
	next.checkNoDupes(t)
	stuck.checkNoDupes(t)
	if n := h.seenCount(); n != 10 {
		t.Fatalf("%d events seen, want 10", n)
	}
}
