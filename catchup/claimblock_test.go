package catchup_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/lockkey"
)

// A claim blocked on the checkpoint row (an operator's open transaction
// holds it) holds up neither the Run's stop, nor the lock session's other
// partitions; once the row is free the claim goes through, also for a
// CatchUp that was waiting meanwhile.
func TestClaimBlockedOnCheckpointRow(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	a := startInstance(t, db, "A", catchup.Config{})
	b := startInstance(t, db, "B", catchup.Config{ShutdownTimeout: time.Second})
	// run starts a Run of subscriber name on in and returns what stops it
	// and how long the Run took to return.
	run := func(in *instance, name string) func() time.Duration {
		rctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := in.engine.Run(rctx, &catchup.Subscription{Name: name, Processor: nopProcessor{}}); err != nil {
				t.Errorf("%s: Run(%s) = %v", in.name, name, err)
			}
		}()
		stop := sync.OnceValue(func() time.Duration {
			start := time.Now()
			cancel()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Errorf("%s: Run(%s) did not return within 20s of its context's end", in.name, name)
				<-done
			}
			return time.Since(start)
		})
		t.Cleanup(func() { stop() })
		return stop
	}
	owner := func(name string) (string, int64) {
		var o string
		var e int64
		_ = db.Pool.QueryRow(ctx, `SELECT coalesce(owner, ''), epoch FROM annals.checkpoints WHERE subscriber_id = $1 AND partition = 0`, name).Scan(&o, &e)
		return o, e
	}
	stopA := run(a, "s")
	annalstest.WaitFor(t, 10*time.Second, func() bool { o, _ := owner("s"); return o == "A" })
	stopB := run(b, "s")
	_, before := owner("s")

	// An operator's transaction holds the checkpoint row.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rollback := sync.OnceFunc(func() { _ = tx.Rollback(context.Background()) })
	t.Cleanup(rollback) // before the instances stop
	if _, err := tx.Exec(ctx, `SELECT 1 FROM annals.checkpoints WHERE subscriber_id = 's' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// A's lock session dies: the lock is free, and whoever takes it blocks
	// in the claim.
	k1, k2 := lockkey.Pair(catchup.LockKey("", "s", 0))
	if _, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted
		AND classid = ($1::int8 & 4294967295)::oid AND objid = ($2::int8 & 4294967295)::oid
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, k1, k2); err != nil {
		t.Fatal(err)
	}
	claiming := func(in *instance) bool {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = $1 AND wait_event_type = 'Lock'`, in.name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return claiming(b) })

	// The lock session serves its other partitions meanwhile.
	run(b, "other")
	annalstest.WaitFor(t, 5*time.Second, func() bool { o, _ := owner("other"); return o == "B" })

	// B's Run of s stops at once.
	if d := stopB(); d > 3*time.Second {
		t.Errorf("B's Run stopped %v after its context ended, while a claim waited for the checkpoint row; want within ShutdownTimeout", d)
	}

	// A (its lock session back) claims once the row is free.
	rollback()
	annalstest.WaitFor(t, 10*time.Second, func() bool { o, e := owner("s"); return o == "A" && e > before })

	// A CatchUp that finds the row held waits, and claims once it is free.
	stopA()
	tx, err = db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rollback = sync.OnceFunc(func() { _ = tx.Rollback(context.Background()) })
	t.Cleanup(rollback)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM annals.checkpoints WHERE subscriber_id = 's' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	caught := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		caught <- b.engine.CatchUp(cctx, &catchup.Subscription{Name: "s", Processor: nopProcessor{}}, 0)
	}()
	annalstest.WaitFor(t, 10*time.Second, func() bool { return claiming(b) })
	rollback()
	if err := <-caught; err != nil {
		t.Fatalf("CatchUp = %v; want it to claim once the checkpoint row is free", err)
	}
	if o, _ := owner("s"); o != "B" {
		t.Fatalf("owner of s after B's CatchUp: %q", o)
	}
}
