package projection_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/projection"
)

// A projection catching up commits its batches without waiting for their
// WAL flush (Options.SyncCommits unset). PostgreSQL is killed (SIGKILL to
// every process, no shutdown) in the middle of a catch-up, on a cluster
// whose commits are otherwise synchronous and whose WAL writer is stopped
// (stopWALWriter): batches whose commits were still in PostgreSQL's
// buffers are lost, with their checkpoint. After crash recovery the read
// model is exactly what its checkpoint says, and the next run applies the
// rest: every event once, in order.
func TestCatchUpSurvivesACrashWithAsyncCommits(t *testing.T) {
	t.Parallel()
	// The budget covers a cluster of the test's own (initdb, start, 3,000
	// appends) besides the catch-up of a few seconds: a loaded CI machine
	// running the suite under -race once took more than 90 s for it.
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	const n = 3000
	cluster, h, head := sleepyWALCluster(ctx, t, n)

	// The handler stops at the 2,000th event until PostgreSQL is dead.
	var (
		once    sync.Once
		reached = make(chan struct{})
		crashed = make(chan struct{})
	)
	p := &seenProjection{name: "seen", before: func(ctx context.Context, e eventstore.Event) error {
		if e.GlobalSequence >= head-n+2000 {
			once.Do(func() { close(reached) })
			select {
			case <-crashed:
			case <-ctx.Done():
			}
		}
		return nil
	}}
	cfg := testConfig(time.Second)
	r := h.newRunner(cfg, &projection.Options{BatchSize: 50}, p)
	before := crashMidCatchUp(ctx, t, cluster, h, r, "seen", reached, crashed)

	after := h.checkpoint("seen")
	t.Logf("checkpoint %d before the crash, %d after recovery: %d events' batches lost with their read-model rows", before, after, before-after)
	// The batches' commits sat in WAL buffers that the stopped WAL writer
	// had not written: lost. (A synchronous commit
	// would have been written and flushed before the checkpoint moved.)
	// This relies on nothing else committing synchronously on this private
	// cluster between that batch and the crash: the runner's own
	// synchronous writes (its claim, its instance heartbeat every 10 s)
	// come before the batches or far apart.
	if after >= before {
		t.Fatalf("checkpoint %d after recovery, %d before the crash: no asynchronous commit was lost, so none was made", after, before)
	}
	if got, want := h.seenCount(), h.query(`SELECT count(*) FROM annals.events WHERE global_sequence <= $1`, after); got != want {
		t.Fatalf("after recovery the read model holds %d events, its checkpoint (%d) accounts for %d", got, after, want)
	}

	// A new process catches up from the recovered checkpoint.
	p2 := &seenProjection{name: "seen"}
	r2 := h.newRunner(cfg, &projection.Options{BatchSize: 50}, p2)
	if err := r2.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	h.checkSeenIsLog("seen")
	p.checkNoDupes(t)
	p2.checkNoDupes(t)
	if got := h.seenCount(); got != n {
		t.Fatalf("%d events in the read model, %d in the log", got, n)
	}
}

// blockingLog is a deliveryLog whose before hook runs ahead of each
// recording (nil: none).
type blockingLog struct {
	deliveryLog
	before func(ctx context.Context, e eventstore.Event) error
}

func (o *blockingLog) Handle(ctx context.Context, e eventstore.Event) error {
	if o.before != nil {
		if err := o.before(ctx, e); err != nil {
			return err
		}
	}
	return o.deliveryLog.Handle(ctx, e)
}

// An observer catching up writes its checkpoints without waiting for their
// WAL flush (Options.SyncCommits unset). PostgreSQL is killed in the middle
// of the catch-up, on a cluster whose WAL writer is stopped: the last
// writes are lost, and the next run delivers again from the recovered
// checkpoint, so nothing is skipped (at least once, per-stream order). With
// SyncCommits the checkpoint the observer had written survives the crash.
func TestObserverCatchUpSurvivesACrash(t *testing.T) {
	t.Parallel()
	// One after the other: each kills a cluster of its own, and make test
	// runs enough clusters at once already.
	for _, syncCommits := range []bool{false, true} {
		t.Run(fmt.Sprintf("SyncCommits=%v", syncCommits), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second) // see TestCatchUpSurvivesACrashWithAsyncCommits
			defer cancel()
			const n = 3000
			cluster, h, head := sleepyWALCluster(ctx, t, n)
			opts := &projection.Options{BatchSize: 50, CheckpointEvery: 50, SyncCommits: syncCommits}

			// The handler stops at the 2,000th event until PostgreSQL is dead.
			var (
				once    sync.Once
				reached = make(chan struct{})
				crashed = make(chan struct{})
			)
			o1 := &blockingLog{deliveryLog: deliveryLog{name: "obs"}, before: func(ctx context.Context, e eventstore.Event) error {
				if e.GlobalSequence >= head-n+2000 {
					once.Do(func() { close(reached) })
					select {
					case <-crashed:
					case <-ctx.Done():
					}
					return errors.New("the server is gone")
				}
				return nil
			}}
			cfg := testConfig(time.Second)
			before := crashMidCatchUp(ctx, t, cluster, h, h.newRunner(cfg, opts, o1), "obs", reached, crashed)

			after := h.checkpoint("obs")
			t.Logf("checkpoint %d before the crash, %d after recovery", before, after)
			if before < head-n+1000 {
				t.Fatalf("checkpoint %d when the handler reached event %d: the observer wrote too few checkpoints", before, head-n+2000)
			}
			// The same reliance as TestCatchUpSurvivesACrashWithAsyncCommits:
			// nothing else commits synchronously between the last write and
			// the crash, so an asynchronous write sits unflushed.
			if !syncCommits && after >= before {
				t.Fatalf("checkpoint %d after recovery, %d before the crash: no asynchronous write was lost, so none was made", after, before)
			}
			if syncCommits && after != before {
				t.Fatalf("checkpoint %d after recovery, %d before the crash: a synchronous write was lost", after, before)
			}

			// A new process delivers from the recovered checkpoint on:
			// nothing between it and what the first run delivered is skipped.
			o2 := &deliveryLog{name: "obs"}
			if err := h.newRunner(cfg, opts, o2).RunUntilCaughtUp(ctx); err != nil {
				t.Fatal(err)
			}
			second := o2.deliveries()
			if first := h.query(`SELECT min(global_sequence) FROM annals.events WHERE global_sequence > $1`, after); len(second) == 0 || second[0].GlobalSequence != first {
				t.Fatalf("after recovery at checkpoint %d the observer started at %v, want position %d", after, second[:min(len(second), 1)], first)
			}
			all := &deliveryLog{name: "obs", got: append(o1.deliveries(), second...)}
			redelivered := h.checkAtLeastOnceInOrder(all)
			t.Logf("%d events delivered again", redelivered)
			if want := int(h.query(`SELECT count(*) FROM annals.events WHERE global_sequence > $1 AND global_sequence < $2`, after, head-n+2000)); redelivered != want {
				t.Fatalf("%d events delivered again, want the %d between the recovered checkpoint and the crash", redelivered, want)
			}
		})
	}
}

// stopWALWriter stops PostgreSQL's WAL writer (SIGSTOP) and returns the
// function that kills it (SIGKILL), which the crash calls first; the test's
// cleanup calls it too, should the test end before the crash. Even asleep
// for wal_writer_delay, the WAL writer wakes on its timer and whenever an
// asynchronous commit completes a WAL page, and a wake-up that finds no
// whole page to write writes and flushes every asynchronous commit
// instead, the last partial page included. A CI run saw no write lost,
// with autovacuum and the background writer's cleaning already off; the WAL
// writer is what was left that writes WAL on its own in the milliseconds
// between the last asynchronous write and the crash. Stopped, it writes
// nothing, so the asynchronous writes since the last synchronous commit are
// lost (how many, the tests do not depend on). PostgreSQL's children run in
// process groups of their own and a stopped one would not notice the
// postmaster's death, hence the kill of its own.
func stopWALWriter(ctx context.Context, t *testing.T, h *liveHarness) (kill func()) {
	t.Helper()
	var pid int
	if err := h.pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'`).Scan(&pid); err != nil {
		t.Fatalf("finding the WAL writer: %v", err)
	}
	var once sync.Once
	kill = func() {
		once.Do(func() {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Errorf("killing the stopped WAL writer (PID %d): %v", pid, err)
			}
		})
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("stopping the WAL writer (PID %d): %v", pid, err)
	}
	t.Cleanup(kill)
	return kill
}

// crashMidCatchUp stops the WAL writer, runs r.RunUntilCaughtUp until its
// handler closes reached (and waits for crashed), reads sub's checkpoint, kills PostgreSQL (SIGKILL
// to every process), closes crashed, stops the run and waits for it, and
// brings the server back. It returns the checkpoint read before the crash.
func crashMidCatchUp(ctx context.Context, t *testing.T, cluster *pgcluster.Cluster, h *liveHarness, r *projection.Runner,
	sub string, reached <-chan struct{}, crashed chan struct{}) int64 {
	t.Helper()
	killWALWriter := stopWALWriter(ctx, t, h)
	done := make(chan error, 1)
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	go func() { done <- r.RunUntilCaughtUp(rctx) }()
	select {
	case <-reached:
	case err := <-done:
		t.Fatalf("the catch-up ended before the crash: %v", err)
	case <-ctx.Done():
		t.Fatal("the catch-up never reached the 2,000th event")
	}
	before := h.checkpoint(sub)
	killWALWriter()
	if err := cluster.Crash(ctx); err != nil {
		t.Fatal(err)
	}
	close(crashed)
	rcancel() // the runner would otherwise retry until the server is back
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the runner did not return after the crash")
	}
	if err := cluster.Up(ctx); err != nil {
		t.Fatal(err)
	}
	h.pool.Reset() // its connections died with the server
	return before
}

// sleepyWALCluster starts a cluster of the test's own whose commits are
// synchronous and whose WAL writer sleeps 10 s (until crashMidCatchUp
// stops it), appends n events over 10 streams and returns
// the head. Autovacuum is off: an ANALYZE of the freshly filled tables
// commits synchronously, and its flush would make the asynchronous commits
// before it durable (a CI run once saw no write lost). The background
// writer's cleaning is off for the same reason: writing a dirty page first
// flushes the WAL up to that page's last change, which made the last
// batch's commit durable in another CI run.
func sleepyWALCluster(ctx context.Context, t *testing.T, n int) (*pgcluster.Cluster, *liveHarness, int64) {
	t.Helper()
	cluster, h := clusterOfItsOwn(ctx, t, &pgcluster.Options{Settings: map[string]string{
		"synchronous_commit": "on", "wal_writer_delay": "10000", "autovacuum": "off",
		"bgwriter_lru_maxpages": "0",
	}})
	h.appendEvents(n, 10)
	return cluster, h, h.head()
}
