package catchup_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
)

// TakeOver queues for the lock before it fences the holder: whenever the
// checkpoint's epoch has moved, TakeOver's session already asks for the lock
// in pg_locks. (Fencing first left a window, between the fence and the
// queueing, in which the fenced leader could let go and take the lock back
// as a standby, claiming a new epoch that TakeOver then had to fence again.)
// The holder here is a bare session that never looks at the checkpoint, so
// the window, if it existed, would stay open until TakeOver had connected.
func TestTakeOverQueuesBeforeItFences(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	c := startInstance(t, db, "c", catchup.Config{})
	sub := &catchup.Subscription{Name: "s", Processor: nopProcessor{}}
	key := catchup.LockKey("", "s", 0)
	cc, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := advisorylock.Acquire(ctx, cc, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Release(context.Background()) })
	k1, k2 := advisorylock.Key(key)
	state := func() (epoch int64, asked bool) {
		t.Helper()
		// One statement, one snapshot of both.
		err := db.Pool.QueryRow(ctx, `
			SELECT coalesce((SELECT epoch FROM annals.checkpoints WHERE subscriber_id = 's' AND partition = 0), -1),
			       EXISTS (SELECT 1 FROM pg_locks
			                WHERE locktype = 'advisory' AND objsubid = 2 AND pid <> $3
			                  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			                  AND classid = ($1::int4::int8 & 4294967295)::oid AND objid = ($2::int4::int8 & 4294967295)::oid)`,
			k1, k2, int32(holder.PID())).Scan(&epoch, &asked)
		if err != nil {
			t.Fatal(err)
		}
		return epoch, asked
	}
	before, _ := state()

	type result struct {
		lease *catchup.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		lease, err := c.engine.TakeOver(ctx, sub, 10*time.Second)
		got <- result{lease, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	polls := 0
	for {
		polls++
		epoch, asked := state()
		if epoch != before {
			if !asked {
				t.Fatalf("the epoch moved (%d → %d) while TakeOver's session did not yet ask for the lock", before, epoch)
			}
			break
		}
		select {
		case r := <-got:
			t.Fatalf("TakeOver returned before it fenced: %+v, %v", r.lease, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("TakeOver never fenced")
		}
	}
	t.Logf("the fence came after %d polls, with TakeOver queued", polls)
	select {
	case r := <-got:
		t.Fatalf("TakeOver returned while the lock was held: %+v, %v", r.lease, r.err)
	default:
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("TakeOver: %+v", r.err)
	}
	defer c.engine.Release(ctx, r.lease)
	if own, ep := owners(t, db, 1); own[0] != "c" || ep[0] != r.lease.Epoch {
		t.Fatalf("the checkpoint says owner %q at epoch %d; the lease has epoch %d", own[0], ep[0], r.lease.Epoch)
	}
}
