package catchup

import (
	"context"
	"log/slog"
	"time"

	"github.com/annals-dev/annals/internal/ratelog"
	"github.com/annals-dev/annals/internal/telemetry"
)

// readFailures is the run of failed reads of a live leadership (a read
// replica down, say, while the primary, which holds the lock, is up: the
// leadership goes on and retries after each RetryBackoff). The first is
// logged at WARN, the next at DEBUG and at WARN again at most once a
// minute (a ratelog.Run), each with the count and how long they have been
// failing; the first read that succeeds after them, at INFO. A replica
// down for an hour logged two WARNs a second.
type readFailures struct {
	run ratelog.Run
}

// failed logs a failed read.
func (f *readFailures) failed(ctx context.Context, e *Engine, sub *Subscription, err error) {
	level := f.run.Failed()
	e.cfg.Logger.Log(ctx, level, "annals: read failed", slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition),
		slog.Int("failures", f.run.Count()), slog.Duration("failing_for", f.run.For().Round(time.Millisecond)), telemetry.Err(err))
}

// ok ends a run of failed reads, logging its end at INFO.
func (f *readFailures) ok(ctx context.Context, e *Engine, sub *Subscription) {
	if n, lasted, ok := f.run.Recovered(); ok {
		e.cfg.Logger.InfoContext(ctx, "annals: reads work again", slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition),
			slog.Int("failures", n), slog.Duration("failed_for", lasted.Round(time.Millisecond)))
	}
}
