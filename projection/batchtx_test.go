package projection_test

import (
	"context"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// batchTxProjection uses the batch's transaction every way a handler may.
type batchTxProjection struct {
	xids      []int64
	commitErr error
}

func (p *batchTxProjection) Name() string { return "batchtx" }

func (p *batchTxProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	var xid int64
	switch e.StreamVersion {
	case 1:
		// The first statement (BEGIN goes with it), then a read of it.
		if _, err := tx.Exec(ctx, `INSERT INTO bt VALUES ($1)`, 1); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM bt`).Scan(&n); err != nil {
			return err
		}
		if n != 1 {
			return annals.Permanent(errors.Newf("the handler's own write is not visible: %d rows", n))
		}
	case 2:
		// A savepoint rolled back, and a statement without arguments.
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, `INSERT INTO bt VALUES ($1)`, 100); err != nil {
			return err
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO bt VALUES (2)`); err != nil {
			return err
		}
	case 3:
		p.commitErr = tx.Commit(ctx)
	}
	if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid); err != nil {
		return err
	}
	p.xids = append(p.xids, xid)
	return nil
}

// A projection's batch transaction is begun lazily (with the first
// statement, or with the checkpoint and COMMIT): every handler call of the
// batch runs in one transaction all the same, savepoints work, the writes
// commit with the checkpoint, and a handler cannot commit it itself.
func TestBatchTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.db.Pool.Exec(ctx, `CREATE TABLE bt (x int)`); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := b.store.Append(ctx, "bt-1", eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
			t.Fatal(err)
		}
	}
	p := &batchTxProjection{}
	r, err := projection.NewRunner(b.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(p, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if len(p.xids) != 3 || p.xids[0] != p.xids[1] || p.xids[1] != p.xids[2] {
		t.Fatalf("transaction IDs of the handler calls %v, want one transaction", p.xids)
	}
	if p.commitErr == nil {
		t.Fatal("a handler committed the batch's transaction")
	}
	rows, err := b.db.Pool.Query(ctx, `SELECT x FROM bt ORDER BY x`)
	if err != nil {
		t.Fatal(err)
	}
	xs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	if len(xs) != 2 || xs[0] != 1 || xs[1] != 2 {
		t.Fatalf("rows %v, want [1 2]", xs)
	}
	var pos int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT position FROM annals.checkpoints WHERE subscriber_id = 'batchtx'`).Scan(&pos); err != nil || pos != 3 {
		t.Fatalf("checkpoint %d (%v), want 3", pos, err)
	}
}
