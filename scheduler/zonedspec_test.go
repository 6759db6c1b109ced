package scheduler

import (
	"slices"
	"testing"
	"time"
)

// A spec's ticks are exactly the instants whose wall time in the task's
// zone matches it, through every kind of offset change: whole hours
// (Berlin, New York), half an hour (Lord Howe, +11 to +10:30 on
// 2026-04-05), 45 minutes (Chatham). robfig/cron's own Next had no tick
// for "0 2 * * *" in Lord Howe on 2026-04-05, although 02:00 +10:30 happens
// once that day.
func TestCronTicksAreTheWallTimesThatMatchInEveryZone(t *testing.T) {
	t.Parallel()
	windows := []time.Time{ // 72 h from each, around 2026's changes
		time.Date(2026, 3, 28, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 10, 24, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 3, 7, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 10, 31, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 4, 3, 12, 0, 0, 0, time.UTC),
		time.Date(2026, 9, 26, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 10, 3, 0, 0, 0, 0, time.UTC),
	}
	for _, zone := range []string{"Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Pacific/Chatham", "Asia/Kolkata", "UTC"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		for _, spec := range []string{"0 2 * * *", "30 2 * * *", "30 1 * * *", "0 3 * * *", "45 2 * * *", "0 * * * *", "*/15 * * * *", "0 0 * * *"} {
			sched, _, err := parseSpec(spec, zone)
			if err != nil {
				t.Fatal(err)
			}
			z := sched.(zonedSpec)
			for _, from := range windows {
				to := from.Add(72 * time.Hour)
				var want, got []time.Time
				for m := from.Add(time.Minute); !m.After(to); m = m.Add(time.Minute) {
					w := m.In(loc)
					if z.spec.Minute&(1<<uint(w.Minute())) != 0 && z.spec.Hour&(1<<uint(w.Hour())) != 0 {
						want = append(want, m)
					}
				}
				for n := sched.Next(from); !n.IsZero() && !n.After(to); n = sched.Next(n) {
					got = append(got, n.UTC())
				}
				if !slices.EqualFunc(got, want, time.Time.Equal) {
					t.Errorf("%q in %s from %s: ticks\n %v\nwant\n %v", spec, zone, from.Format(time.DateOnly), got, want)
				}
				// latestDue finds each of them from the window's start.
				for _, tick := range want {
					if l, due := latestDue(sched, from, tick.Add(30*time.Second)); !due || !l.Equal(tick) {
						t.Errorf("%q in %s: latestDue(%s, %s) = %s, %v; want %s", spec, zone, from, tick.Add(30*time.Second), l, due, tick)
					}
				}
			}
		}
	}
	// The tick that robfig/cron left out.
	sched, _, _ := parseSpec("0 2 * * *", "Australia/Lord_Howe")
	if n := sched.Next(time.Date(2026, 4, 4, 12, 0, 0, 0, time.UTC)); !n.Equal(time.Date(2026, 4, 4, 15, 30, 0, 0, time.UTC)) {
		t.Errorf("Next tick of 0 2 * * * in Lord Howe after 2026-04-04 12:00Z = %s, want 02:00 +10:30 on 2026-04-05", n)
	}
}
