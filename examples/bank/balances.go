package main

import (
	"context"
	_ "embed"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/projection"
)

//go:embed balances.sql
var balancesSQL string

// balancesQ are the named statements of balances.sql.
var balancesQ = func() map[string]string {
	q, err := sqltmpl.Named("balances.sql", balancesSQL, sqltmpl.NewData("annals"))
	if err != nil {
		panic(err)
	}
	return q
}()

// balancesName is the projection's subscriber name: its checkpoint, its
// lock, and the NAME of `bank projections rebuild NAME`.
const balancesName = "bank.balances"

// accountStreamPrefix is how the repository names account streams.
const accountStreamPrefix = "account-"

// execer is a pgx.Tx, a connection or a pool.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// newBalances returns the bank.balances projection: a typed projection
// whose handlers update bank_balances in the runner's transaction, so each
// event changes the read model exactly once. It is a projection.Resetter:
// its Reset creates the table if needed and empties it, which lets
// `bank projections rebuild bank.balances` rebuild it from the log (and lets
// testkit.ReplayProjection set it up).
func newBalances(reg *eventstore.Registry) *projection.Typed {
	p := projection.New(balancesName, reg)
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[AccountOpened]) error {
		_, err := tx.Exec(ctx, balancesQ["Open"], accountID(e.StreamID), e.Data.Owner, e.StreamVersion, e.RecordedAt)
		return err
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[MoneyDeposited]) error {
		return updateOne(ctx, tx, "Deposit", e.Event, e.Data.Amount)
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[MoneyWithdrawn]) error {
		return updateOne(ctx, tx, "Withdraw", e.Event, e.Data.Amount)
	})
	p.OnReset(func(ctx context.Context, tx pgx.Tx) error {
		if err := createBalancesTable(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, balancesQ["Truncate"])
		return errors.Wrap(err, "truncate bank_balances")
	})
	return p
}

// updateOne applies a deposit or withdrawal to its account's row; a missing
// row means the log and the read model disagree, which is an error (the
// runner retries it, then dead-letters it), never silently ignored.
func updateOne(ctx context.Context, tx pgx.Tx, query string, e eventstore.Event, amount int64) error {
	tag, err := tx.Exec(ctx, balancesQ[query], accountID(e.StreamID), amount, e.StreamVersion, e.RecordedAt)
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.Newf("bank_balances has no row for account %s", accountID(e.StreamID))
	}
	return err
}

// createBalancesTable creates the read model's table if it does not exist:
// the service runs it at start-up, before the runner.
func createBalancesTable(ctx context.Context, db execer) error {
	_, err := db.Exec(ctx, balancesQ["CreateTable"])
	return errors.Wrap(err, "create bank_balances")
}

// accountID is the account ID of an account stream ("account-42" → "42").
func accountID(stream string) string { return strings.TrimPrefix(stream, accountStreamPrefix) }

// balanceRow is a row of bank_balances.
type balanceRow struct {
	AccountID   string
	Owner       string
	Balance     int64
	Deposits    int
	Withdrawals int
	Version     int64
}

// queryer is a pool, a connection or a transaction.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// listBalances returns the rows whose account ID starts with prefix.
func listBalances(ctx context.Context, db queryer, prefix string) ([]balanceRow, error) {
	rows, err := db.Query(ctx, balancesQ["List"], likePrefix(prefix))
	if err != nil {
		return nil, errors.Wrap(err, "read bank_balances")
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[balanceRow])
	return out, errors.Wrap(err, "read bank_balances")
}

// likePrefix escapes prefix for LIKE and appends the wildcard.
func likePrefix(prefix string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(prefix) + "%"
}
