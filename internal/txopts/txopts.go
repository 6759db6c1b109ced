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

// Take returns the options ctx asks for, and ctx without them and without
// QuietWhenEmpty: what Transact hands its body and the inline projections,
// so that a transaction they begin with that context (another Store's
// Transact) gets its own session's defaults and telemetry, not what was
// asked of this one.
func Take(ctx context.Context) (pgx.TxOptions, context.Context) {
	opts := From(ctx)
	if IsQuietWhenEmpty(ctx) {
		ctx = context.WithValue(ctx, quietKey{}, false)
	}
	if opts == (pgx.TxOptions{}) {
		return opts, ctx
	}
	return opts, context.WithValue(ctx, key{}, nil)
}

type quietKey struct{}

// QuietWhenEmpty returns ctx asking Transact to record its telemetry (the
// "annals.transact" span and the append metrics) only when the transaction
// appends something or fails. The scheduler's dispatcher claims timers in a
// Transact at every pass, and a pass that finds none due is no append: it
// made an empty producer span, and an "ok" point in the append latency
// histogram, at least once per PollInterval in every process. The span of a
// transaction that is recorded starts when Transact began; fn's context
// carries no span of it (a claim's appends are encoded when scheduled,
// with the trace context of the caller of Schedule).
func QuietWhenEmpty(ctx context.Context) context.Context {
	return context.WithValue(ctx, quietKey{}, true)
}

// IsQuietWhenEmpty reports whether ctx asks for QuietWhenEmpty.
func IsQuietWhenEmpty(ctx context.Context) bool {
	quiet, _ := ctx.Value(quietKey{}).(bool)
	return quiet
}
