package catchup

import (
	"context"
	"log/slog"
	"time"

	"github.com/annals-dev/annals/internal/telemetry"
)

// readFailLogEvery is how often a live leadership whose reads keep failing
// logs it again at WARN.
const readFailLogEvery = time.Minute

// readFailures is the run of failed reads of a live leadership (a read
// replica down, say, while the primary, which holds the lock, is up: the
// leadership goes on and retries after each RetryBackoff). The first is
// logged at WARN, the next at DEBUG and at WARN again at most once per
// readFailLogEvery, each with the count and how long they have been
// failing; the first read that succeeds after them, at INFO. A replica
// down for an hour logged two WARNs a second.
type readFailures struct {
	n             int
	since, warned time.Time
}

// failed logs a failed read.
func (f *readFailures) failed(ctx context.Context, e *Engine, sub *Subscription, err error) {
	now := time.Now()
	if f.n++; f.n == 1 {
		f.since = now
	}
	level := slog.LevelDebug
	if f.n == 1 || now.Sub(f.warned) >= readFailLogEvery {
		level, f.warned = slog.LevelWarn, now
	}
	e.cfg.Logger.Log(ctx, level, "annals: read failed", slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition),
		slog.Int("failures", f.n), slog.Duration("failing_for", now.Sub(f.since).Round(time.Millisecond)), telemetry.Err(err))
}

// ok ends a run of failed reads, logging its end at INFO.
func (f *readFailures) ok(ctx context.Context, e *Engine, sub *Subscription) {
	if f.n == 0 {
		return
	}
	e.cfg.Logger.InfoContext(ctx, "annals: reads work again", slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition),
		slog.Int("failures", f.n), slog.Duration("failed_for", time.Since(f.since).Round(time.Millisecond)))
	*f = readFailures{}
}
