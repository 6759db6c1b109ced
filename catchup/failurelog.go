package catchup

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/annals-dev/annals/internal/ratelog"
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
// the end of the run, when the caller sees it, an INFO line (a ratelog.Run
// whose Gap is failureRunGap). Not safe for concurrent use.
type failureLog struct {
	log *slog.Logger
	now func() time.Time // nil: time.Now

	r ratelog.Run
}

// run returns the failure log's ratelog.Run, set to its policy and clock.
func (f *failureLog) run() *ratelog.Run {
	f.r.Every, f.r.Gap, f.r.Now = failureSummary, failureRunGap, f.now
	return &f.r
}

// running reports whether a run of failures is under way: a failure now
// would continue it rather than start one.
func (f *failureLog) running() bool {
	return f.run().Failing()
}

// failed logs a failure: msg with attrs, at WARN or DEBUG (see failureLog).
func (f *failureLog) failed(ctx context.Context, msg string, attrs ...slog.Attr) {
	r := f.run()
	level := r.Failed()
	if r.Count() == 1 {
		f.log.LogAttrs(ctx, level, msg, attrs...)
		return
	}
	attrs = append(attrs, slog.Int("failures", r.Count()), slog.Duration("since", r.For()))
	if level == slog.LevelWarn {
		msg += " (still failing)"
	}
	f.log.LogAttrs(ctx, level, msg, attrs...)
}

// recovered ends the current run, if any, with msg at INFO, saying how many
// failures it had and for how long. A run whose last failure is more than
// failureRunGap ago has ended unseen: it ends without a line.
func (f *failureLog) recovered(ctx context.Context, msg string, attrs ...slog.Attr) {
	if n, lasted, ok := f.run().Recovered(); ok {
		attrs = append(attrs, slog.Int("failures", n), slog.Duration("after", lasted))
		f.log.LogAttrs(ctx, slog.LevelInfo, msg, attrs...)
	}
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
