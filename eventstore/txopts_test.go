package eventstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/txopts"
)

// The options a package of annals asks Transact for (the scheduler's claims:
// READ COMMITTED) apply to that transaction only: its body, and the inline
// projections run with its context, get a context that asks for nothing, so
// a Transact they start (of another Store, on a database whose default is
// SERIALIZABLE) keeps its session's defaults.
func TestTransactOptionsStayWithTheirTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := txopts.With(context.Background(), pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	_, err := b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, _ *eventstore.Batch) error {
		var iso string
		if err := tx.QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil {
			return err
		}
		if iso != "read committed" {
			t.Errorf("the transaction runs %s, want read committed", iso)
		}
		if got := txopts.From(ctx); got != (pgx.TxOptions{}) {
			t.Errorf("the body's context still asks for %+v", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
