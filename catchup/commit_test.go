package catchup_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
)

// Lease.CommitTx sends the fenced checkpoint move and COMMIT in one round
// trip: it commits the transaction's writes with the checkpoint, and when
// the lease is fenced (here: an operator set the checkpoint, bumping its
// epoch) it commits nothing, neither the writes nor the checkpoint, and
// reports checkpoint.ErrFenced; the lock's connection stays usable.
func TestCommitTxFenced(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE written (x int)`); err != nil {
		t.Fatal(err)
	}
	e, err := catchup.NewEngine(db.Pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := checkpoint.New("")
	if err != nil {
		t.Fatal(err)
	}
	lease, err := e.TakeOver(ctx, &catchup.Subscription{Name: "committx", Processor: nopProcessor{}}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Release(ctx, lease)
	write := func(x int, pos int64) error {
		return lease.Do(ctx, func(conn *pgx.Conn) error {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO written VALUES ($1)`, x); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			if err := lease.CommitTx(ctx, tx, pos); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			return nil
		})
	}
	state := func() (rows int, pos int64) {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM written`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		cp, err := store.Load(ctx, db.Pool, "committx", 0)
		if err != nil {
			t.Fatal(err)
		}
		return rows, cp.Position
	}

	if err := write(1, 5); err != nil {
		t.Fatal(err)
	}
	if rows, pos := state(); rows != 1 || pos != 5 {
		t.Fatalf("after a commit: %d rows, checkpoint %d; want 1, 5", rows, pos)
	}
	if _, err := store.Set(ctx, db.Pool, "committx", 0, 2); err != nil {
		t.Fatal(err)
	}
	if err := write(2, 9); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("commit after the epoch moved: %v, want ErrFenced", err)
	}
	if rows, pos := state(); rows != 1 || pos != 2 {
		t.Fatalf("after a fenced commit: %d rows, checkpoint %d; want 1, 2", rows, pos)
	}
	if err := lease.Do(ctx, func(conn *pgx.Conn) error { return conn.Ping(ctx) }); err != nil {
		t.Fatalf("the lock's connection after a fenced commit: %v", err)
	}
}
