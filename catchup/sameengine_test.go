package catchup_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/lockkey"
)

// Two Runs of one partition on one engine, and a CatchUp of it while a Run
// leads: the engine's lock session would take the lock again on its own
// session (advisory locks are re-entrant), so the second would lead too and
// fence the first, for ever. The second stands by, as it would in another
// process, and the lock is taken once.
func TestSameEnginePartitionTakenOnce(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	var leads, ends atomic.Int64
	in := startInstance(t, db, "one", catchup.Config{OnLeadership: func(_ string, _ int, _ int64, leading bool) {
		if leading {
			leads.Add(1)
		} else {
			ends.Add(1)
		}
	}})
	epoch := func() int64 {
		var e int64
		if err := db.Pool.QueryRow(t.Context(), `SELECT epoch FROM annals.checkpoints WHERE subscriber_id = 's'`).Scan(&e); err != nil {
			return -1
		}
		return e
	}
	k1, k2 := lockkey.Pair(catchup.LockKey("", "s", 0))
	// grants counts the grants of the partition's lock (a session that
	// took it twice holds it twice).
	grants := func() int {
		var n int
		if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted
			AND classid = ($1::int8 & 4294967295)::oid AND objid = ($2::int8 & 4294967295)::oid
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, k1, k2).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	sub := func() *catchup.Subscription { return &catchup.Subscription{Name: "s", Processor: nopProcessor{}} }
	// start starts a Run of sub and returns what stops it and returns
	// its error (once; it is also called at cleanup).
	start := func() func() error {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- in.engine.Run(ctx, sub()) }()
		stop := sync.OnceValue(func() error { cancel(); return <-done })
		t.Cleanup(func() { _ = stop() })
		return stop
	}
	stopA := start()
	annalstest.WaitFor(t, 10*time.Second, func() bool { return leads.Load() == 1 })
	stopB := start()

	// For a second (50 polls), the second Run stands by.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		if n := leads.Load(); n != 1 {
			t.Fatalf("%d leaderships began with two Runs of one partition on one engine; want 1", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e := epoch(); e != 1 {
		t.Fatalf("epoch %d after one leadership; want 1", e)
	}
	if n := grants(); n != 1 {
		t.Fatalf("the partition's lock is granted %d times; want 1", n)
	}

	// CatchUp on the same engine waits for the lock while the Run leads.
	cctx, ccancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	err := in.engine.CatchUp(cctx, sub(), 0)
	ccancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("CatchUp while a Run of the engine leads = %v; want it to wait for the lock until its context ends", err)
	}
	if e, n := epoch(), leads.Load(); e != 1 || n != 1 {
		t.Fatalf("after CatchUp: epoch %d, %d leaderships; want 1 and 1 (the leading Run fenced)", e, n)
	}

	// The leader stops: the standing-by Run takes over, and the lock is
	// then held once, by it.
	if err := stopA(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return leads.Load() == 2 && epoch() == 2 })
	// The stopped leadership's unlock may run just after the new one's
	// take (both on the engine's one lock session, which PostgreSQL counts
	// per session): the count settles at one.
	annalstest.WaitFor(t, 10*time.Second, func() bool { return grants() == 1 })
	if err := stopB(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return grants() == 0 })
	if n := ends.Load(); n != 2 {
		t.Fatalf("%d leaderships ended; want 2", n)
	}
}
