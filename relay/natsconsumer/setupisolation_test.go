package natsconsumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/projection"
)

// TestRunProjectionSetupUnderRepeatableReadDefault: two consumers (durables
// of their own, pools of their own whose sessions default to REPEATABLE
// READ) run the same projection into one database; the second starts
// while the first's setup runs, which it holds until the second waits for
// the setup lock. The second
// finds the first one's record and runs nothing, as the consumer begins
// its setup transaction READ COMMITTED. Before, its snapshot, taken before
// the wait, did not show the record: it ran the setup again, and failed on
// its CREATE TABLE.
func TestRunProjectionSetupUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dst := annalstest.NewDB(t, nil)
	dst.SetDefaultIsolation(t, "repeatable read")
	consumer, reg := relayedSetup(t, ctx, 3)
	var runs atomic.Int32
	p := projection.New("rr-copy", reg)
	projection.On(p, func(context.Context, pgx.Tx, eventstore.Envelope[Deposited]) error { return nil })
	p.OnSetup(1, func(ctx context.Context, tx pgx.Tx) error {
		if runs.Add(1) == 1 {
			if err := waitForSetupWaiter(ctx, dst, "rr-copy"); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `CREATE TABLE rr_copy (pos bigint PRIMARY KEY)`)
		return err
	})

	rctx, stop := context.WithCancel(ctx)
	defer stop()
	durables := []string{"rr-a", "rr-b"}
	done := make(chan error, len(durables))
	for _, durable := range durables {
		pool := dst.NewPool(t)
		c := consumer(durable)
		go func() { done <- c.RunProjection(rctx, pool, p) }()
		// The second starts once the first is in its setup (past the
		// creation of the checkpoint table, which two consumers starting
		// at once on a fresh database race).
		annalstest.WaitFor(t, 30*time.Second, func() bool { return runs.Load() > 0 })
	}
	var early error
	returned := 0
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		select {
		case early = <-done:
			returned++
			return true
		default:
		}
		var n int
		_ = dst.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.relay_checkpoints
			WHERE consumer = ANY($1) AND stream_seq = 3`, durables).Scan(&n)
		return n == len(durables)
	})
	if early != nil {
		t.Errorf("a consumer stopped: %v", early)
	}
	stop()
	for range len(durables) - returned {
		if err := <-done; err != nil {
			t.Errorf("a consumer: %v", err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the setup ran %d times; want once", n)
	}
}

// waitForSetupWaiter polls pg_locks until a session of db waits for the
// setup lock of the projection name (projection.EnsureSetup's key), for 30
// seconds at most.
func waitForSetupWaiter(ctx context.Context, db *annalstest.DB, name string) error {
	k1, k2 := lockkey.Pair(db.Schema + ":setup:" + name)
	return annalstest.WaitForLockWaiter(ctx, db.Pool, k1, k2)
}
