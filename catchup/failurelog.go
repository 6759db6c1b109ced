package catchup

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/annals-dev/annals/internal/telemetry"
)

// failureSummary is how often a run of repeated failures is logged at WARN
// again while it lasts; the repeats in between are DEBUG.
const failureSummary = time.Minute

// failureRunGap is how far apart two failures may be and still belong to
// one run (one outage): a failure after a longer quiet starts a new run,
// logged at WARN.
const failureRunGap = time.Minute

// failureLog keeps the log of a failure that repeats while an outage lasts
// (the database down: an engine's partitions retry their locks about once a
// second, see lockFailures, the listener its connection) readable: the first failure of a run is a
// WARN, the repeats are DEBUG with a WARN summary every failureSummary, and
// the end of the run, when the caller sees it, an INFO line. Not safe for
// concurrent use.
type failureLog struct {
	log *slog.Logger
	now func() time.Time // nil: time.Now

	failures            int // in the current run; 0: no run
	first, last, warned time.Time
}

func (f *failureLog) clock() time.Time {
	if f.now == nil {
		return time.Now()
	}
	return f.now()
}

// running reports whether a run of failures is under way: a failure now
// would continue it rather than start one.
func (f *failureLog) running() bool {
	return f.failures > 0 && f.clock().Sub(f.last) <= failureRunGap
}

// failed logs a failure: msg with attrs, at WARN or DEBUG (see failureLog).
func (f *failureLog) failed(ctx context.Context, msg string, attrs ...slog.Attr) {
	now := f.clock()
	if f.failures == 0 || now.Sub(f.last) > failureRunGap {
		f.failures, f.first, f.last, f.warned = 1, now, now, now
		f.log.LogAttrs(ctx, slog.LevelWarn, msg, attrs...)
		return
	}
	f.failures++
	f.last = now
	attrs = append(attrs, slog.Int("failures", f.failures), slog.Duration("since", now.Sub(f.first)))
	if now.Sub(f.warned) >= failureSummary {
		f.warned = now
		f.log.LogAttrs(ctx, slog.LevelWarn, msg+" (still failing)", attrs...)
		return
	}
	f.log.LogAttrs(ctx, slog.LevelDebug, msg, attrs...)
}

// recovered ends the current run, if any, with msg at INFO, saying how many
// failures it had and for how long. A run whose last failure is more than
// failureRunGap ago has ended unseen: it ends without a line.
func (f *failureLog) recovered(ctx context.Context, msg string, attrs ...slog.Attr) {
	if f.failures == 0 {
		return
	}
	now := f.clock()
	if now.Sub(f.last) > failureRunGap {
		f.failures = 0
		return
	}
	attrs = append(attrs, slog.Int("failures", f.failures), slog.Duration("after", now.Sub(f.first)))
	f.failures = 0
	f.log.LogAttrs(ctx, slog.LevelInfo, msg, attrs...)
}

// partitionID names a subscriber partition driven by an Engine.
type partitionID struct {
	subscriber string
	partition  int
}

// lockFailures is the failure log of an Engine's lock retries, one for all
// its partitions: they share the engine's lock session and fail together,
// each about once a second while the database is down. So an outage logs
// one WARN line when it starts, one summary a minute and one INFO line when
// it ends per Engine, however many partitions it drives; each line says how
// many partitions failed in the run (partitions). The run ends when a
// partition that failed in it takes its lock; the others that failed then
// log nothing more than "leading". Safe for concurrent use.
type lockFailures struct {
	mu      sync.Mutex
	log     failureLog
	failing map[partitionID]struct{} // the partitions that failed in the current run
}

func newLockFailures(log *slog.Logger) *lockFailures {
	return &lockFailures{log: failureLog{log: log}, failing: map[partitionID]struct{}{}}
}

// failed logs that sub's partition could not take its lock.
func (l *lockFailures) failed(ctx context.Context, sub *Subscription, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.log.running() {
		clear(l.failing)
	}
	l.failing[partitionID{sub.Name, sub.Partition}] = struct{}{}
	l.log.failed(ctx, "annals: cannot take the subscription lock",
		slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition),
		slog.Int("partitions", len(l.failing)), telemetry.Err(err))
}

// took ends the current run when sub's partition, which failed in it, has
// taken its lock.
func (l *lockFailures) took(ctx context.Context, sub *Subscription) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.failing[partitionID{sub.Name, sub.Partition}]; !ok {
		return
	}
	l.log.recovered(ctx, "annals: took the subscription lock again",
		slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition),
		slog.Int("partitions", len(l.failing)))
	clear(l.failing)
}
