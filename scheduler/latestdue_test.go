package scheduler

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
)

// walkLatestDue is latestDue by definition: the ticks from after on, one by
// one, up to the last at or before now.
func walkLatestDue(t *testing.T, spec, zone string, after, now time.Time) (time.Time, bool) {
	t.Helper()
	sched, _, err := parseSpec(spec, zone)
	if err != nil {
		t.Fatal(err)
	}
	tick := sched.Next(after)
	if tick.IsZero() || tick.After(now) {
		return time.Time{}, false
	}
	for n := sched.Next(tick); !n.IsZero() && !n.After(now); n = sched.Next(tick) {
		tick = n
	}
	return tick, true
}

// latestDue finds the tick a walk over every tick finds, for sparse and
// dense specs, across daylight saving changes, and for instants that are
// not whole seconds.
func TestLatestDueIsTheLastTickAtOrBeforeNow(t *testing.T) {
	t.Parallel()
	// maxSpan keeps the walk short: it visits every tick.
	specs := []struct {
		spec, zone string
		maxSpan    time.Duration
	}{
		{"* * * * * *", "UTC", time.Hour},
		{"*/7 * * * * *", "Europe/Berlin", 3 * time.Hour},
		{"30 2 * * *", "Europe/Berlin", 400 * 24 * time.Hour},
		{"0 * * * *", "Europe/Berlin", 20 * 24 * time.Hour},
		{"15,45 1-3 * * *", "America/New_York", 100 * 24 * time.Hour},
		{"0 0 * * *", "America/Sao_Paulo", 400 * 24 * time.Hour},
		{"*/30 * * * *", "Australia/Lord_Howe", 10 * 24 * time.Hour},
		{"0 9 * * 1-5", "Asia/Tokyo", 400 * 24 * time.Hour},
		{"0 0 29 2 *", "UTC", 3 * 400 * 24 * time.Hour},
		{"@monthly", "Pacific/Chatham", 3 * 400 * 24 * time.Hour},
		{"* * * * 1-6 *", "UTC", time.Hour},
		{"59 59 23 31 12 *", "UTC", 3 * 400 * 24 * time.Hour},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, sp := range specs {
		sched, _, err := parseSpec(sp.spec, sp.zone)
		if err != nil {
			t.Fatal(err)
		}
		for range 50 {
			after := base.Add(time.Duration(rng.Int64N(int64(3 * 365 * 24 * time.Hour))))
			if rng.IntN(2) == 0 {
				after = after.Add(time.Duration(rng.Int64N(int64(time.Second))))
			}
			span := time.Duration(rng.Int64N(int64(sp.maxSpan)))
			if rng.IntN(3) == 0 {
				span = time.Duration(rng.Int64N(int64(10 * time.Second)))
			}
			now := after.Add(span)
			want, wantOK := walkLatestDue(t, sp.spec, sp.zone, after, now)
			got, ok := latestDue(sched, after, now)
			if ok != wantOK || !got.Equal(want) {
				t.Errorf("%q in %s, (%s, %s]: latestDue = %s %v, want %s %v",
					sp.spec, sp.zone, after.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano), got, ok, want, wantOK)
			}
		}
	}
	// Around the fall-back hour, where a wall time happens twice.
	sched, _, _ := parseSpec("30 2 * * *", "Europe/Berlin")
	after := utc("2026-10-24T12:00:00Z")
	for _, c := range []struct{ now, want string }{
		{"2026-10-25T00:29:59Z", "2026-10-24T00:30:00Z"},
		{"2026-10-25T00:30:00Z", "2026-10-25T00:30:00Z"},
		{"2026-10-25T01:29:59Z", "2026-10-25T00:30:00Z"},
		{"2026-10-25T01:30:00Z", "2026-10-25T01:30:00Z"},
		{"2026-10-26T01:29:59Z", "2026-10-25T01:30:00Z"},
	} {
		got, ok := latestDue(sched, after.Add(-24*time.Hour), utc(c.now))
		if !ok || !got.Equal(utc(c.want)) {
			t.Errorf("fall back, now %s: latestDue = %s %v, want %s", c.now, got.UTC(), ok, c.want)
		}
	}
}

// A dense spec after a long outage: latestDue takes a few dozen calls of
// Next, not one per tick (it used to walk every tick, up to ten million
// calls, and then stop at an intermediate one).
func TestLatestDueOfADenseSpecIsCheap(t *testing.T) {
	t.Parallel()
	sched, _, err := parseSpec("* * * * 1-6 *", "Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingSchedule{Schedule: sched}
	after := time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC)
	now := time.Date(2027, 8, 5, 0, 0, 0, 0, time.UTC)
	got, ok := latestDue(counted, after, now)
	berlin, _ := time.LoadLocation("Europe/Berlin")
	if want := time.Date(2027, 6, 30, 23, 59, 59, 0, berlin); !ok || !got.Equal(want) {
		t.Errorf("latestDue = %s %v, want %s", got, ok, want)
	}
	if counted.calls > 200 {
		t.Errorf("latestDue called Next %d times", counted.calls)
	}
}

// countingSchedule counts the calls of Next.
type countingSchedule struct {
	Schedule interface{ Next(time.Time) time.Time }
	calls    int
}

func (c *countingSchedule) Next(t time.Time) time.Time {
	c.calls++
	return c.Schedule.Next(t)
}

// FireLatest after one long outage of a task with a dense spec fires the
// latest missed tick once, at once: not an intermediate tick first, and
// not after seconds of CPU inside the claim's transaction.
func TestCronFireLatestAfterALongOutageOfADenseSpec(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC))
	s := newScheduler(t, db, &Config{Clock: clock})
	if err := s.AddTask(t.Context(), Task{Name: "h1", Spec: "* * * * 1-6 *", TimeZone: "Europe/Berlin", StreamID: "h1"}); err != nil {
		t.Fatal(err)
	}
	clock.Set(time.Date(2027, 8, 5, 0, 0, 0, 0, time.UTC))
	for i := range 3 {
		start := time.Now()
		fireDue(t, s)
		if d := time.Since(start); d > time.Second {
			t.Errorf("pass %d took %s", i, d)
		}
	}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	want := []time.Time{time.Date(2027, 6, 30, 23, 59, 59, 0, berlin).UTC()}
	if got := ticks(t, db, "h1"); !equalTimes(got, want) {
		t.Errorf("fired %v, want the latest missed tick once: %v", got, want)
	}
}
