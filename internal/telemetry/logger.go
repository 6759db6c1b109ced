package telemetry

import (
	"context"
	"log/slog"
)

// DefaultLogger is the logger of a part whose Config sets none: the
// warnings and errors it logs (a dead letter, a lost leadership, a failed
// publish) go to slog.Default(), looked up at each record, so a program's
// later slog.SetDefault is followed; information and debug records are
// dropped. Silence a part with a logger of its own
// (slog.New(slog.DiscardHandler)).
func DefaultLogger() *slog.Logger { return slog.New(warnings{}) }

// warnings is DefaultLogger's handler: slog.Default()'s, from Warn up, with
// the attributes and groups added to it replayed on each record.
type warnings struct {
	ops []func(slog.Handler) slog.Handler
}

func (w warnings) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && slog.Default().Handler().Enabled(ctx, l)
}

func (w warnings) Handle(ctx context.Context, r slog.Record) error {
	h := slog.Default().Handler()
	for _, op := range w.ops {
		h = op(h)
	}
	return h.Handle(ctx, r)
}

func (w warnings) WithAttrs(as []slog.Attr) slog.Handler {
	return w.with(func(h slog.Handler) slog.Handler { return h.WithAttrs(as) })
}

func (w warnings) WithGroup(name string) slog.Handler {
	return w.with(func(h slog.Handler) slog.Handler { return h.WithGroup(name) })
}

func (w warnings) with(op func(slog.Handler) slog.Handler) warnings {
	return warnings{ops: append(w.ops[:len(w.ops):len(w.ops)], op)}
}
