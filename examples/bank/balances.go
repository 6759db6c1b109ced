package main

import (
	"context"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// The bank_balances read model: one row per account, kept by the
// bank.balances projection in the transactions that move its checkpoint.
const (
	createBalancesSQL = `CREATE TABLE IF NOT EXISTS bank_balances (
    account_id  text PRIMARY KEY,
    owner       text NOT NULL,
    balance     bigint NOT NULL DEFAULT 0, -- cents
    deposits    int NOT NULL DEFAULT 0,
    withdrawals int NOT NULL DEFAULT 0,
    version     bigint NOT NULL,           -- stream version of the last event applied
    updated_at  timestamptz NOT NULL
)`
	truncateBalancesSQL = `TRUNCATE bank_balances`
	openSQL             = `INSERT INTO bank_balances (account_id, owner, version, updated_at) VALUES ($1, $2, $3, $4)`
	depositSQL          = `UPDATE bank_balances
   SET balance = balance + $2, deposits = deposits + 1, version = $3, updated_at = $4
 WHERE account_id = $1`
	withdrawSQL = `UPDATE bank_balances
   SET balance = balance - $2, withdrawals = withdrawals + 1, version = $3, updated_at = $4
 WHERE account_id = $1`
	listSQL = `SELECT account_id, owner, balance, deposits, withdrawals, version
  FROM bank_balances
 WHERE account_id LIKE $1
 ORDER BY account_id`
)

// balancesName is the projection's subscriber name: its checkpoint, its
// lock, and the NAME of `bank projections rebuild NAME`.
const balancesName = "bank.balances"

// accountStreamPrefix is how the repository names account streams.
const accountStreamPrefix = "account-"

// newBalances returns the bank.balances projection: a typed projection
// whose handlers update bank_balances in the runner's transaction, so each
// event changes the read model exactly once. Its table is created by its
// setup (OnSetup), which the runner runs once per version before the
// projection first runs (and a rebuild, and testkit.ReplayProjection, before
// Reset); its Reset empties the table, which lets `bank projections rebuild
// bank.balances` rebuild it from the log.
func newBalances(reg *eventstore.Registry) *projection.Typed {
	p := projection.New(balancesName, reg)
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[AccountOpened]) error {
		_, err := tx.Exec(ctx, openSQL, accountID(e.StreamID), e.Data.Owner, e.StreamVersion, e.RecordedAt)
		return err
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[MoneyDeposited]) error {
		return updateOne(ctx, tx, depositSQL, e.Event, e.Data.Amount)
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[MoneyWithdrawn]) error {
		return updateOne(ctx, tx, withdrawSQL, e.Event, e.Data.Amount)
	})
	p.OnSetup(1, projection.Statements(createBalancesSQL))
	p.OnReset(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, truncateBalancesSQL)
		return errors.Wrap(err, "truncate bank_balances")
	})
	return p
}

// updateOne applies a deposit or withdrawal to its account's row; a missing
// row means the log and the read model disagree, which is an error (the
// runner retries it, then dead-letters it), never silently ignored.
func updateOne(ctx context.Context, tx pgx.Tx, query string, e eventstore.Event, amount int64) error {
	tag, err := tx.Exec(ctx, query, accountID(e.StreamID), amount, e.StreamVersion, e.RecordedAt)
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.Newf("bank_balances has no row for account %s", accountID(e.StreamID))
	}
	return err
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
	rows, err := db.Query(ctx, listSQL, likePrefix(prefix))
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
