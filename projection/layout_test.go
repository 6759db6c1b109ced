package projection_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// TestRunnerRefusesAnotherPartitionLayout: a projection redeployed with
// another partition count (or key) would skip and repeat events; Run and
// RunUntilCaughtUp refuse to start it instead, and say why.
func TestRunnerRefusesAnotherPartitionLayout(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, `SELECT `+pgx.Identifier{db.Schema}.Sanitize()+
		`.append_events('order-1', 0, '[{"type": "bg.counted", "data": {"v": 1}}]')`); err != nil {
		t.Fatal(err)
	}
	runner := func(parts int, by string) *projection.Runner {
		reg := eventstore.NewRegistry()
		eventstore.MustRegister[Counted](reg, "bg.counted")
		p := projection.New("layout", reg)
		projection.On(p, func(context.Context, pgx.Tx, eventstore.Envelope[Counted]) error { return nil })
		r, err := projection.NewRunner(db.Pool, &projection.Config{InstanceID: "layout", RetryBackoff: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(p, &projection.Options{Partitions: parts, PartitionBy: by}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if err := runner(2, "").RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		parts int
		by    string
	}{{3, ""}, {1, ""}, {2, catchup.PartitionByCategory}} {
		err := runner(tc.parts, tc.by).RunUntilCaughtUp(ctx)
		if !errors.Is(err, catchup.ErrPartitionLayout) {
			t.Fatalf("RunUntilCaughtUp with %d partitions by %q: %v, want ErrPartitionLayout", tc.parts, tc.by, err)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = runner(tc.parts, tc.by).Run(rctx)
		stillRunning := rctx.Err() != nil
		cancel()
		if !errors.Is(err, catchup.ErrPartitionLayout) || stillRunning {
			t.Fatalf("Run with %d partitions by %q: %v (ran until its deadline: %v), want ErrPartitionLayout at once", tc.parts, tc.by, err, stillRunning)
		}
		t.Log(err)
	}
	if err := runner(2, catchup.PartitionByStream).RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
}

// A rebuild with NewLayout changes a projection's partition count in place:
// the old layout's runner, still running and leading while events keep
// coming, is fenced and refused from then on; the new layout's runner takes
// over after the rebuild; every event is applied exactly once. Without
// NewLayout the rebuild is refused, with nothing changed.
func TestRebuildChangesTheLayout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	resettable := func() *projection.Typed {
		p := balances(b.reg)
		p.OnReset(func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `DELETE FROM balances`)
			return err
		})
		return p
	}
	runner := func(id string, parts int) *projection.Runner {
		r, err := projection.NewRunner(b.db.Pool, &projection.Config{InstanceID: id, PollInterval: 50 * time.Millisecond,
			LockRetryInterval: 100 * time.Millisecond, RetryBackoff: 50 * time.Millisecond, ShutdownTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(resettable(), &projection.Options{Partitions: parts}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	want := appendN(t, b, 200, 7)
	oldCtx, stopOld := context.WithCancel(ctx)
	oldDone := make(chan error, 1)
	old := runner("old", 2)
	go func() { oldDone <- old.Run(oldCtx) }()
	defer stopOld()
	// The old layout has processed events: its layout is fixed.
	if head, err := b.store.Head(ctx); err != nil {
		t.Fatal(err)
	} else if err := old.Await(ctx, "balances", head); err != nil {
		t.Fatal(err)
	}

	// Events keep coming throughout.
	var stop atomic.Bool
	stopWriter := func() { stop.Store(true) }
	var mu sync.Mutex
	written := make(chan error, 1)
	go func() {
		for i := 0; !stop.Load(); i++ {
			// New streams too: the old leaders' batches insert rows
			// (a reset must not miss a row inserted but not yet
			// committed when it ran).
			s := fmt.Sprintf("acct-%d", i%7)
			if i%2 == 1 {
				s = fmt.Sprintf("fresh-%d", i)
			}
			if _, err := b.store.Append(ctx, s, eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
				written <- err
				return
			}
			mu.Lock()
			want[s]++
			mu.Unlock()
			time.Sleep(2 * time.Millisecond) // the writer's pace, not a wait for a condition
		}
		written <- nil
	}()

	nr := runner("new", 3)
	if err := nr.Rebuild(ctx, "balances", nil); !errors.Is(err, catchup.ErrPartitionLayout) {
		t.Fatalf("Rebuild with another layout: %v, want ErrPartitionLayout", err)
	}
	if err := nr.Rebuild(ctx, "balances", &projection.RebuildOptions{NewLayout: true, LockTimeout: 30 * time.Second}); err != nil {
		t.Fatalf("Rebuild with NewLayout: %v", err)
	}
	newCtx, stopNew := context.WithCancel(ctx)
	newDone := make(chan error, 1)
	go func() { newDone <- nr.Run(newCtx) }()
	defer stopNew()
	// The old layout's runner cannot lead any more; its Run goes on
	// standing by (refused) until it is stopped, which the operator does.
	stopWriter()
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	stopOld()
	<-oldDone
	mu.Lock()
	defer mu.Unlock()
	// Every partition catches up (Await waits for one stream's partition).
	annalstest.WaitFor(t, 60*time.Second, func() bool {
		got := readBalances(t, b)
		for s, w := range want {
			if got[s] < w {
				return false
			}
		}
		return true
	})
	got := readBalances(t, b)
	for s, w := range want {
		if got[s] != w {
			t.Errorf("%s: %d, want %d (each event once)", s, got[s], w)
		}
	}
	var parts int
	var by string
	if err := b.db.Pool.QueryRow(ctx, `SELECT partitions, partition_by FROM `+pgx.Identifier{b.db.Schema}.Sanitize()+
		`.subscriber_layouts WHERE subscriber_id = 'balances'`).Scan(&parts, &by); err != nil || parts != 3 {
		t.Fatalf("recorded layout %d by %q (%v), want 3", parts, by, err)
	}
	stopNew()
	if err := <-newDone; err != nil {
		t.Fatal(err)
	}
}
