// Package txopts lets another package of annals choose the options of the
// transaction that eventstore.Store.Transact begins, which are otherwise
// the session's defaults: the scheduler's claims run READ COMMITTED
// whatever the server's default_transaction_isolation says, since under
// REPEATABLE READ or SERIALIZABLE a claim fails to serialize (40001) when
// another dispatcher appends to its stream or deletes a row it skipped.
// Users choose the isolation of their own transactions (AppendTx), so
// Transact keeps no public option for it.
package txopts

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type key struct{}

// With returns ctx asking Transact to begin its transaction with opts.
func With(ctx context.Context, opts pgx.TxOptions) context.Context {
	return context.WithValue(ctx, key{}, opts)
}

// From returns the options ctx asks for: the zero value (the session's
// defaults) when it asks for none.
func From(ctx context.Context) pgx.TxOptions {
	opts, _ := ctx.Value(key{}).(pgx.TxOptions)
	return opts
}

// Take returns the options ctx asks for, and ctx without them: what
// Transact hands its body and the inline projections, so that a
// transaction they begin with that context (another Store's Transact) gets
// its own session's defaults, not the options meant for this one.
func Take(ctx context.Context) (pgx.TxOptions, context.Context) {
	opts := From(ctx)
	if opts == (pgx.TxOptions{}) {
		return opts, ctx
	}
	return opts, context.WithValue(ctx, key{}, nil)
}
