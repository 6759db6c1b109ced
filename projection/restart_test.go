package projection_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/projection"
)

// TestRunnerRestartResumes is the contract's item 5: a runner that is
// stopped and started again (the same Runner, or a new one standing for a
// new process) resumes from its checkpoint: nothing is applied twice and
// nothing is missed, and after each run the checkpoint is the head.
func TestRunnerRestartResumes(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) *liveHarness {
		t.Helper()
		return newLiveHarness(t)
	}
	// checkRun fails unless the read model is the log and the checkpoint
	// the head, with the given number of events.
	checkRun := func(h *liveHarness, p *seenProjection, events int64) {
		h.t.Helper()
		h.checkSeenIsLog("seen")
		p.checkNoDupes(h.t)
		if n := h.seenCount(); n != events {
			h.t.Fatalf("%d events seen, want %d", n, events)
		}
	}

	t.Run("StopAndStart", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		p := &seenProjection{name: "seen"}
		r := h.newRunner(testConfig(time.Second), &projection.Options{BatchSize: 30}, p)

		h.appendEvents(100, 4)
		stop := h.run(r)
		h.waitCaughtUp(10*time.Second, "seen")
		h.appendEvents(50, 4) // live
		h.waitCaughtUp(10*time.Second, "seen")
		stop()
		checkRun(h, p, 150)

		h.appendEvents(70, 5) // while nobody runs
		if cp := h.checkpoint("seen"); cp != 150 {
			t.Fatalf("checkpoint moved to %d while stopped", cp)
		}
		stop = h.run(r) // the same Runner again
		h.waitCaughtUp(10*time.Second, "seen")
		stop()
		checkRun(h, p, 220)

		// A new process: new Runner, new projection value.
		h.appendEvents(30, 6)
		p2 := &seenProjection{name: "seen"}
		r2 := h.newRunner(testConfig(time.Second), nil, p2)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := r2.RunUntilCaughtUp(ctx); err != nil {
			t.Fatal(err)
		}
		checkRun(h, p2, 250)
		stop = h.run(r2)
		h.appendEvents(10, 2)
		h.waitCaughtUp(10*time.Second, "seen")
		stop()
		checkRun(h, p2, 260)
		// One claim per leadership: 2 runs of r, RunUntilCaughtUp, 1 run of r2.
		if e := h.epoch("seen"); e != 4 {
			t.Fatalf("epoch %d, want 4", e)
		}
	})

	// Stopped in the middle of a long catch-up, the runner finishes its
	// batch, and the next run starts where it ended.
	t.Run("StopDuringCatchUp", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var events []eventstore.EventData
		for i := range 2000 {
			events = append(events, movedEvent(i))
		}
		for i := 0; i < len(events); i += 100 { // 20 streams of 100
			if _, err := h.store.Append(ctx, fmt.Sprintf("acct-%d", i/100), eventstore.NoStream, events[i:i+100]...); err != nil {
				t.Fatal(err)
			}
		}
		p := &seenProjection{name: "seen"}
		r := h.newRunner(testConfig(time.Second), &projection.Options{BatchSize: 10}, p)
		stop := h.run(r)
		annalstest.WaitFor(t, 10*time.Second, func() bool { return h.checkpoint("seen") >= 100 })
		stop()
		cp := h.checkpoint("seen")
		if cp >= 2000 {
			t.Fatalf("the catch-up was over (checkpoint %d) before it was stopped", cp)
		}
		// Exactly the events through the checkpoint are applied.
		if n, top := h.seenCount(), h.query(`SELECT coalesce(max(global_sequence), 0) FROM seen`); n != cp || top != cp {
			t.Fatalf("stopped at checkpoint %d with %d events seen, the last at %d", cp, n, top)
		}
		t.Logf("stopped at %d of 2000", cp)
		stop = h.run(r)
		h.waitCaughtUp(20*time.Second, "seen")
		stop()
		checkRun(h, p, 2000)
	})
}

// TestPostgresRestart: PostgreSQL restarts while a writer appends and the
// runner is live. Every connection dies (the lock's, the listener's, the
// pool's); the runner reconnects, claims again, and the read model ends
// equal to the log, nothing lost and nothing applied twice.
func TestPostgresRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	setup := func(t *testing.T) (*pgcluster.Cluster, *liveHarness) {
		t.Helper()
		return clusterOfItsOwn(ctx, t)
	}

	cluster, h := setup(t)
	p := &seenProjection{name: "seen"}
	r := h.newRunner(testConfig(500*time.Millisecond), &projection.Options{BatchSize: 20}, p)
	stop := h.run(r)

	// The writer appends n events one at a time, paced, each with its own
	// ID, and retries an append that fails (the server is down, the
	// connection was cut) until it succeeds: a retry of an append that did
	// commit is idempotent, so the log gets each event exactly once.
	const n = 400
	var written atomic.Int64
	var retries atomic.Int64
	writerDone := make(chan error, 1)
	restarted := make(chan struct{}) // the writer waits at n/2 until the restart is over
	go func() {
		pace := time.NewTicker(4 * time.Millisecond) // ~1.6 s of appends: the restart falls in the middle
		defer pace.Stop()
		for i := range n {
			<-pace.C
			if i == n/2 {
				select {
				case <-restarted:
				case <-ctx.Done():
				}
			}
			e := movedEvent(i)
			stream := fmt.Sprintf("acct-%d", i%7)
			for {
				_, err := h.store.Append(ctx, stream, eventstore.Any, e)
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					writerDone <- fmt.Errorf("event %d: %w", i, err)
					return
				}
				retries.Add(1)
				time.Sleep(20 * time.Millisecond) // back off before retrying, not a wait for a condition
			}
			written.Add(1)
		}
		writerDone <- nil
	}()

	annalstest.WaitFor(t, 10*time.Second, func() bool { return h.seenCount() > 0 }) // the runner is live
	annalstest.WaitFor(t, 30*time.Second, func() bool { return written.Load() >= n/4 })
	start := time.Now()
	before := written.Load()
	if err := cluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	close(restarted)
	t.Logf("restarted in %v, between events %d and %d", time.Since(start), before, written.Load())
	select {
	case err := <-writerDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatalf("the writer did not finish: %d of %d events written", written.Load(), n)
	}
	t.Logf("writer retried %d appends", retries.Load())
	h.waitCaughtUp(30*time.Second, "seen")
	stop()

	h.checkSeenIsLog("seen")
	p.checkNoDupes(t)
	if got := h.seenCount(); got != n {
		t.Fatalf("%d events seen, want %d", got, n)
	}
	if e := h.epoch("seen"); e < 2 {
		t.Fatalf("epoch %d: the runner never claimed again, so it did not see the restart", e)
	}
	// Every event the writer meant to append is in the log once.
	var ids []uuid.UUID
	for e, err := range h.store.ReadAll(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.ID)
	}
	if len(ids) != n {
		t.Fatalf("the log holds %d events, want %d", len(ids), n)
	}
}

// clusterOfItsOwn starts a throwaway cluster (opts may be nil) for a test
// that restarts, stops or crashes PostgreSQL, migrates it, and returns it
// with a live harness on it; both are stopped when the test ends.
func clusterOfItsOwn(ctx context.Context, t *testing.T, opts ...*pgcluster.Options) (*pgcluster.Cluster, *liveHarness) {
	t.Helper()
	var o *pgcluster.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	cluster, pool := annalstest.PrivateCluster(t, ctx, o)
	return cluster, liveHarnessOn(t, pool)
}
