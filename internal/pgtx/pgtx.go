package pgtx

import (
	"context"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ReadCommitted are the options of annals' own transactions that take a
// lock and then read what the lock's previous holder committed, or update
// a row another process may update at once: READ COMMITTED whatever the
// session's default_transaction_isolation says. Under REPEATABLE READ or
// SERIALIZABLE the snapshot of the transaction's first statement, taken
// before the wait, would miss the other process's work or fail to
// serialize (docs/operations.md, "A REPEATABLE READ or SERIALIZABLE
// default_transaction_isolation").
var ReadCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// Attempts is how many times Retrying runs a transaction at most.
const Attempts = 3

// Retrying runs fn in a transaction on db, and again (up to Attempts times
// in all) when PostgreSQL aborted it with deadlock_detected (40P01) or
// serialization_failure (40001). fn must be safe to run again: the aborted
// attempt changed nothing in the database, but fn's own effects outside it
// are fn's to reset.
func Retrying(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, fn func(tx pgx.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := pgx.BeginFunc(ctx, db, fn)
		if attempt < Attempts && Retryable(err) {
			continue
		}
		return err
	}
}

// Retryable reports a deadlock or a serialization failure.
func Retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}
