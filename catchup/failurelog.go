package catchup

import (
	"context"
	"log/slog"
	"time"
)

// failureSummary is how often a run of repeated failures is logged at WARN
// again while it lasts; the repeats in between are DEBUG.
const failureSummary = time.Minute

// failureRunGap is how far apart two failures may be and still belong to
// one run (one outage): a failure after a longer quiet starts a new run,
// logged at WARN.
const failureRunGap = time.Minute

// failureLog keeps the log of a failure that repeats while an outage lasts
// (the database down: every partition retries its lock about once a second,
// the listener its connection) readable: the first failure of a run is a
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
