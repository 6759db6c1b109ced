package ratelog

import (
	"log/slog"
	"time"
)

// DefaultEvery is Run.Every's default: a lasting condition is a WARN at
// most once a minute.
const DefaultEvery = time.Minute

// Run is a run of occurrences of one condition that repeats (see the
// package doc). Its zero value is ready to use, with no run under way. Not
// safe for concurrent use.
type Run struct {
	// Every is how often, at most, a run is logged at WARN again while it
	// lasts. Defaults to DefaultEvery (a minute).
	Every time.Duration
	// Gap, when positive, is how far apart two occurrences may be and
	// still belong to one run. Defaults to 0: a run lasts until Recovered.
	Gap time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time

	n                   int
	first, last, warned time.Time
	cause               string // FailedWith's cause at the last WARN
}

func (r *Run) now() time.Time {
	if r.Now == nil {
		return time.Now()
	}
	return r.Now()
}

func (r *Run) every() time.Duration {
	if r.Every <= 0 {
		return DefaultEvery
	}
	return r.Every
}

// ended reports whether the run under way, if any, ended more than Gap
// before now.
func (r *Run) ended(now time.Time) bool {
	return r.Gap > 0 && now.Sub(r.last) > r.Gap
}

// Failed records an occurrence now and returns the level to log it at:
// slog.LevelWarn for the first of a run and for the first at least Every
// after the run's last WARN, slog.LevelDebug for the others.
func (r *Run) Failed() slog.Level {
	return r.FailedWith(r.cause)
}

// FailedWith is Failed for an occurrence whose cause (an error's text,
// say) is cause: it is a WARN also when cause is not the cause of the
// run's last WARN, so that a run that changes how it fails says so at
// once. A Run is reported to by Failed or by FailedWith, not both.
func (r *Run) FailedWith(cause string) slog.Level {
	now := r.now()
	if r.n == 0 || r.ended(now) {
		*r = Run{Every: r.Every, Gap: r.Gap, Now: r.Now, first: now}
	}
	r.n++
	r.last = now
	if r.n == 1 || cause != r.cause || now.Sub(r.warned) >= r.every() {
		r.warned, r.cause = now, cause
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// Failing reports whether a run is under way: an occurrence now would
// continue it rather than start one.
func (r *Run) Failing() bool {
	return r.n > 0 && !r.ended(r.now())
}

// Count returns the occurrences of the run under way, the one just
// recorded included; 0 when there is none.
func (r *Run) Count() int { return r.n }

// Since returns when the run under way began: the time of its first
// occurrence (zero when there is none).
func (r *Run) Since() time.Time { return r.first }

// For returns how long the run under way had lasted at its last
// occurrence: from its first to its last (0 for a single one).
func (r *Run) For() time.Duration { return r.last.Sub(r.first) }

// Recovered ends the run under way, if any, and returns its count of
// occurrences and how long it lasted (from its first occurrence to now);
// ok reports whether there was one to log, at INFO. A run whose last
// occurrence is more than Gap ago ended unseen: it ends with ok false.
func (r *Run) Recovered() (n int, lasted time.Duration, ok bool) {
	if r.n == 0 {
		return 0, 0, false
	}
	now := r.now()
	n, lasted, ok = r.n, now.Sub(r.first), !r.ended(now)
	*r = Run{Every: r.Every, Gap: r.Gap, Now: r.Now}
	return n, lasted, ok
}
