package catchup_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
)

// TestTakeOverLeaseKnowsItsCheckpoint: a TakeOver lease knows the
// checkpoint it claimed from the claim on, so its caller may commit through
// it (Lease.CommitTx, Commit) before any Drive, as TestCommitTxFenced does
// from 0. The lease knew the checkpoint only from its first Drive, and
// every such commit of a subscriber whose checkpoint was past 0 failed
// with checkpoint.ErrMoved, as if a commit of its own whose answer was
// lost had landed.
func TestTakeOverLeaseKnowsItsCheckpoint(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	store, err := checkpoint.New("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Set(ctx, db.Pool, "known", 0, 5); err != nil {
		t.Fatal(err)
	}
	e, err := catchup.NewEngine(db.Pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := e.TakeOver(ctx, &catchup.Subscription{Name: "known", Processor: nopProcessor{}}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Release(ctx, lease)
	if lease.Start != 5 {
		t.Fatalf("the lease starts at %d, want 5", lease.Start)
	}
	at := func(want int64) {
		t.Helper()
		cp, err := store.Load(ctx, db.Pool, "known", 0)
		if err != nil {
			t.Fatal(err)
		}
		if cp.Position != want {
			t.Fatalf("checkpoint at %d, want %d", cp.Position, want)
		}
	}
	err = lease.Do(ctx, func(conn *pgx.Conn) error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if err := lease.CommitTx(ctx, tx, 9); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("CommitTx right after TakeOver, the checkpoint at 5: %v", err)
	}
	at(9)
	if err := lease.Do(ctx, func(conn *pgx.Conn) error { return lease.Commit(ctx, conn, 12) }); err != nil {
		t.Fatalf("Commit after it: %v", err)
	}
	at(12)
}
