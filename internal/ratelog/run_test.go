package ratelog_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/annals-dev/annals/internal/ratelog"
)

// clock is a fake clock that tests move by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Unix(1000, 0)} }
func newRun(c *clock) *ratelog.Run   { return &ratelog.Run{Now: c.now} }
func levels(r *ratelog.Run, c *clock, n int, step time.Duration) (warn, debug int) {
	for range n {
		switch l := r.Failed(); l {
		case slog.LevelWarn:
			warn++
		case slog.LevelDebug:
			debug++
		default:
			panic(l)
		}
		c.add(step)
	}
	return warn, debug
}

func TestRun(t *testing.T) {
	t.Parallel()
	t.Run("FirstWarnsRepeatsDebugUntilEvery", func(t *testing.T) {
		t.Parallel()
		c := newClock()
		r := newRun(c)
		if w, d := levels(r, c, 60, time.Second); w != 1 || d != 59 {
			t.Fatalf("60 failures a second apart: %d WARN, %d DEBUG; want 1 and 59", w, d)
		}
		// The 61st, a minute after the first WARN, warns again.
		if l := r.Failed(); l != slog.LevelWarn {
			t.Fatalf("a failure a minute after the WARN: %v, want WARN", l)
		}
		if n, d := r.Count(), r.For(); n != 61 || d != time.Minute {
			t.Fatalf("Count %d, For %v; want 61 and 1m", n, d)
		}
		if l := r.Failed(); l != slog.LevelDebug {
			t.Fatalf("a failure right after a WARN: %v, want DEBUG", l)
		}
	})
	t.Run("EveryIsConfigurable", func(t *testing.T) {
		t.Parallel()
		c := newClock()
		r := &ratelog.Run{Every: 10 * time.Second, Now: c.now}
		if w, d := levels(r, c, 30, time.Second); w != 3 || d != 27 {
			t.Fatalf("30 failures a second apart, Every 10s: %d WARN, %d DEBUG; want 3 and 27", w, d)
		}
	})
	t.Run("RecoveredEndsTheRun", func(t *testing.T) {
		t.Parallel()
		c := newClock()
		r := newRun(c)
		if n, _, ok := r.Recovered(); ok || n != 0 {
			t.Fatalf("Recovered with no run: %d, %v; want 0, false", n, ok)
		}
		start := c.t
		levels(r, c, 5, time.Second)
		if !r.Failing() || !r.Since().Equal(start) {
			t.Fatalf("Failing %v, Since %v; want true, %v", r.Failing(), r.Since(), start)
		}
		c.add(time.Second)
		n, lasted, ok := r.Recovered()
		if !ok || n != 5 || lasted != 6*time.Second {
			t.Fatalf("Recovered: %d, %v, %v; want 5, 6s, true", n, lasted, ok)
		}
		if _, _, ok := r.Recovered(); ok {
			t.Fatal("a second Recovered reports a run")
		}
		if r.Failing() || r.Count() != 0 {
			t.Fatalf("after Recovered: Failing %v, Count %d", r.Failing(), r.Count())
		}
		// The next failure starts a run of its own, with its WARN.
		if l := r.Failed(); l != slog.LevelWarn || r.Count() != 1 || r.For() != 0 || !r.Since().Equal(c.t) {
			t.Fatalf("the first failure after Recovered: %v, Count %d, For %v, Since %v", l, r.Count(), r.For(), r.Since())
		}
	})
	t.Run("FailedWithWarnsWhenTheCauseChanges", func(t *testing.T) {
		t.Parallel()
		c := newClock()
		r := newRun(c)
		want := []struct {
			cause string
			level slog.Level
		}{
			{"a", slog.LevelWarn}, {"a", slog.LevelDebug}, {"b", slog.LevelWarn}, {"b", slog.LevelDebug},
			{"a", slog.LevelWarn}, {"", slog.LevelWarn}, {"", slog.LevelDebug},
		}
		for i, w := range want {
			if l := r.FailedWith(w.cause); l != w.level {
				t.Fatalf("failure %d (%q): %v, want %v", i, w.cause, l, w.level)
			}
			c.add(time.Second)
		}
		c.add(time.Minute)
		if l := r.FailedWith(""); l != slog.LevelWarn {
			t.Fatalf("the same cause a minute later: %v, want WARN", l)
		}
		if r.Count() != len(want)+1 {
			t.Fatalf("Count %d, want %d", r.Count(), len(want)+1)
		}
	})
	t.Run("GapStartsANewRun", func(t *testing.T) {
		t.Parallel()
		c := newClock()
		r := &ratelog.Run{Every: time.Hour, Gap: time.Minute, Now: c.now}
		levels(r, c, 3, time.Second)
		c.add(time.Minute - time.Second) // the last failure is now a minute ago: still the run
		if !r.Failing() {
			t.Fatal("a minute after its last failure, the run is not failing")
		}
		if l := r.Failed(); l != slog.LevelDebug || r.Count() != 4 {
			t.Fatalf("a failure Gap after the last: %v, Count %d; want DEBUG, 4", l, r.Count())
		}
		c.add(time.Minute + time.Nanosecond)
		if r.Failing() {
			t.Fatal("more than Gap after its last failure, the run is still failing")
		}
		if l := r.Failed(); l != slog.LevelWarn || r.Count() != 1 || !r.Since().Equal(c.t) {
			t.Fatalf("a failure more than Gap after the last: %v, Count %d, Since %v; want WARN, 1, now", l, r.Count(), r.Since())
		}
		c.add(time.Minute + time.Nanosecond)
		if n, _, ok := r.Recovered(); ok || n != 1 {
			t.Fatalf("Recovered more than Gap after the last failure: %d, %v; want 1, false (ended unseen)", n, ok)
		}
		if r.Failing() || r.Count() != 0 {
			t.Fatal("a run ended unseen is still under way")
		}
	})
	t.Run("ZeroValueUsesTheWallClockAndAMinute", func(t *testing.T) {
		t.Parallel()
		var r ratelog.Run
		before := time.Now()
		if l := r.Failed(); l != slog.LevelWarn || r.Since().Before(before) || r.Since().After(time.Now()) {
			t.Fatalf("zero Run: %v, Since %v", l, r.Since())
		}
		if l := r.Failed(); l != slog.LevelDebug {
			t.Fatalf("zero Run, a repeat within the minute: %v, want DEBUG", l)
		}
		if n, lasted, ok := r.Recovered(); !ok || n != 2 || lasted < 0 {
			t.Fatalf("zero Run Recovered: %d, %v, %v", n, lasted, ok)
		}
	})
}
