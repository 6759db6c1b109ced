package scheduler

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// ticks returns the ticks of the task's events in stream, in order.
func ticks(t *testing.T, db *annalstest.DB, stream string) []time.Time {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `SELECT event_type, event_id, data::text FROM annals.events WHERE stream_id = $1 ORDER BY global_sequence`, stream)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []time.Time
	for rows.Next() {
		var typ, id, data string
		if err := rows.Scan(&typ, &id, &data); err != nil {
			t.Fatal(err)
		}
		var d TickData
		if err := json.Unmarshal([]byte(data), &d); err != nil || typ != TickEventType {
			t.Fatalf("event %s %s: %v", typ, data, err)
		}
		if want := TickEventID(d.Task, d.Tick).String(); id != want {
			t.Errorf("tick %s has event ID %s, want %s", d.Tick, id, want)
		}
		out = append(out, d.Tick.UTC())
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

func equalTimes(a, b []time.Time) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

func TestCronThreeInstancesFireEachTickOnce(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	var ss []*Scheduler
	for range 3 {
		s := newScheduler(t, db, &Config{Clock: clock, PollInterval: time.Hour})
		// Every process adds the same task at start, as services do.
		if err := s.AddTask(t.Context(), Task{Name: "every-10s", Spec: "*/10 * * * * *", StreamID: "cron"}); err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	for _, s := range ss {
		run(t, s)
	}
	allAsleep := func(after []int64) func() bool {
		return func() bool {
			for i, s := range ss {
				if s.sleeping.Load() <= after[i] {
					return false
				}
			}
			return true
		}
	}
	sleeps := func() []int64 {
		var out []int64
		for _, s := range ss {
			out = append(out, s.sleeping.Load())
		}
		return out
	}
	annalstest.WaitFor(t, 10*time.Second, allAsleep([]int64{0, 0, 0}))
	const steps = 12
	var want []time.Time
	for i := 1; i <= steps; i++ {
		before := sleeps()
		clock.Advance(10 * time.Second)
		want = append(want, t0.Add(time.Duration(i)*10*time.Second))
		annalstest.WaitFor(t, 10*time.Second, func() bool { return len(ticks(t, db, "cron")) >= i })
		annalstest.WaitFor(t, 10*time.Second, allAsleep(before)) // all have looked and gone back to sleep
	}
	if got := ticks(t, db, "cron"); !equalTimes(got, want) {
		t.Fatalf("ticks fired:\n%v\nwant\n%v", got, want)
	}
	var sum int64
	for _, s := range ss {
		sum += s.ticksFired.Load()
	}
	if sum != steps {
		t.Fatalf("the instances fired %d ticks in all, want %d (a tick fired twice)", sum, steps)
	}
	if n := count(t, db, `SELECT count(*) FROM annals.cron_ticks WHERE task = 'every-10s'`); n != steps {
		t.Errorf("cron_ticks has %d rows, want %d", n, steps)
	}
}

func TestCronTimeZoneAndDST(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, spec string
		from, to   time.Time
		want       []time.Time
	}{
		{
			// 02:30 does not exist in Berlin on 2026-03-29 (clocks jump from
			// 02:00 CET to 03:00 CEST): that day has no tick.
			name: "spring forward", spec: "30 2 * * *",
			from: utc("2026-03-27T12:00:00Z"), to: utc("2026-03-31T12:00:00Z"),
			want: []time.Time{utc("2026-03-28T01:30:00Z"), utc("2026-03-30T00:30:00Z"), utc("2026-03-31T00:30:00Z")},
		},
		{
			// 02:30 happens twice in Berlin on 2026-10-25 (03:00 CEST falls
			// back to 02:00 CET): the parser yields both instants.
			name: "fall back", spec: "30 2 * * *",
			from: utc("2026-10-23T12:00:00Z"), to: utc("2026-10-26T12:00:00Z"),
			want: []time.Time{utc("2026-10-24T00:30:00Z"), utc("2026-10-25T00:30:00Z"), utc("2026-10-25T01:30:00Z"), utc("2026-10-26T01:30:00Z")},
		},
		{
			// Hourly ticks stay one UTC hour apart across the change.
			name: "hourly over fall back", spec: "0 * * * *",
			from: utc("2026-10-24T22:30:00Z"), to: utc("2026-10-25T03:30:00Z"),
			want: []time.Time{utc("2026-10-24T23:00:00Z"), utc("2026-10-25T00:00:00Z"), utc("2026-10-25T01:00:00Z"), utc("2026-10-25T02:00:00Z"), utc("2026-10-25T03:00:00Z")},
		},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			// The parser's ticks, as the scheduler reads the spec.
			sched, zone, err := parseSpec(c.spec, "Europe/Berlin")
			if err != nil || zone != "Europe/Berlin" {
				t.Fatal(zone, err)
			}
			var parsed []time.Time
			for tick := sched.Next(c.from); !tick.After(c.to); tick = sched.Next(tick) {
				parsed = append(parsed, tick.UTC())
			}
			if !equalTimes(parsed, c.want) {
				t.Fatalf("parser ticks %v, want %v", parsed, c.want)
			}

			db := annalstest.NewDB(t, nil)
			clock := newFakeClock(c.from)
			s := newScheduler(t, db, &Config{Clock: clock})
			if err := s.AddTask(t.Context(), Task{Name: "berlin", Spec: c.spec, TimeZone: "Europe/Berlin", StreamID: "b"}); err != nil {
				t.Fatal(err)
			}
			// Step through every tick (and just before it): each fires at
			// its instant, not a second earlier.
			for i, tick := range c.want {
				clock.Set(tick.Add(-time.Second))
				if n := fireDue(t, s); n != 0 {
					t.Fatalf("fired %d a second before %s", n, tick)
				}
				clock.Set(tick)
				if n := fireDue(t, s); n != 1 {
					t.Fatalf("fired %d at %s, want 1", n, tick)
				}
				if got := ticks(t, db, "b"); len(got) != i+1 || !got[i].Equal(tick) {
					t.Fatalf("ticks %v after %s", got, tick)
				}
			}
			clock.Set(c.to)
			fireDue(t, s)
			if got := ticks(t, db, "b"); !equalTimes(got, c.want) {
				t.Fatalf("fired %v, want %v", got, c.want)
			}
		})
	}
}

// A tick that is merely late (within MissedGrace) is on time under both
// policies, even after an outage: only the older ticks are missed.
func TestCronLateTickWithinGraceFires(t *testing.T) {
	t.Parallel()
	for _, policy := range []MissedPolicy{FireLatest, SkipMissed} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			db := annalstest.NewDB(t, nil)
			clock := newFakeClock(t0)
			s := newScheduler(t, db, &Config{Clock: clock, MissedGrace: time.Minute})
			if err := s.AddTask(t.Context(), Task{Name: "m", Spec: "* * * * *", StreamID: "m", Missed: policy}); err != nil {
				t.Fatal(err)
			}
			clock.Set(t0.Add(time.Minute + 30*time.Second)) // 30 s late
			if n := fireDue(t, s); n != 1 {
				t.Fatalf("a tick 30 s late fired %d, want 1", n)
			}
			// Down for ten minutes, back 59 s after the tick at +12 min: the
			// ticks at +2..+11 min are missed, +12 min is on time.
			clock.Set(t0.Add(12*time.Minute + 59*time.Second))
			if n := fireDue(t, s); n != 1 {
				t.Fatalf("fired %d after the outage, want 1", n)
			}
			if got, want := ticks(t, db, "m"), []time.Time{t0.Add(time.Minute), t0.Add(12 * time.Minute)}; !equalTimes(got, want) {
				t.Fatalf("ticks %v, want %v", got, want)
			}
		})
	}
}

func TestCronAllMissed(t *testing.T) {
	t.Parallel()
	for _, policy := range []MissedPolicy{FireLatest, SkipMissed} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			db := annalstest.NewDB(t, nil)
			clock := newFakeClock(t0)
			s := newScheduler(t, db, &Config{Clock: clock, MissedGrace: time.Minute})
			if err := s.AddTask(t.Context(), Task{Name: "h", Spec: "@hourly", StreamID: "h", Missed: policy}); err != nil {
				t.Fatal(err)
			}
			// Down for 5 h 10 min: ticks at +1 h .. +5 h are missed, the
			// latest by 10 minutes.
			clock.Set(t0.Add(5*time.Hour + 10*time.Minute))
			n := fireDue(t, s)
			var want []time.Time
			if policy == FireLatest {
				want = append(want, t0.Add(5*time.Hour))
			}
			if got := ticks(t, db, "h"); n != len(want) || !equalTimes(got, want) {
				t.Fatalf("fired %d: %v, want %v", n, got, want)
			}
			infos, err := s.Tasks(t.Context())
			if err != nil || len(infos) != 1 || infos[0].LastTick == nil || !infos[0].LastTick.Equal(t0.Add(5*time.Hour)) ||
				!infos[0].NextTick.Equal(t0.Add(6*time.Hour)) {
				t.Fatalf("Tasks = %+v, %v; want last tick +5 h (fired or skipped), next +6 h", infos, err)
			}
			// Both go on with the next tick.
			clock.Set(t0.Add(6 * time.Hour))
			if n := fireDue(t, s); n != 1 {
				t.Fatalf("the next tick fired %d", n)
			}
		})
	}
}

func TestCronNewTaskDoesNotFireEarlierTicks(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0.Add(30 * time.Second)) // after the tick at t0
	s := newScheduler(t, db, &Config{Clock: clock})
	if err := s.AddTask(t.Context(), Task{Name: "n", Spec: "* * * * *", StreamID: "n"}); err != nil {
		t.Fatal(err)
	}
	if n := fireDue(t, s); n != 0 {
		t.Fatalf("a new task fired %d ticks from before its creation", n)
	}
	// Re-adding the same definition later changes nothing...
	clock.Set(t0.Add(90 * time.Second))
	if err := s.AddTask(t.Context(), Task{Name: "n", Spec: "* * * * *", StreamID: "n"}); err != nil {
		t.Fatal(err)
	}
	if n := fireDue(t, s); n != 1 {
		t.Fatalf("re-adding the same task dropped the due tick (fired %d)", n)
	}
	// ...while a changed one takes effect now.
	clock.Set(t0.Add(150 * time.Second))
	if err := s.AddTask(t.Context(), Task{Name: "n", Spec: "*/30 * * * * *", StreamID: "n"}); err != nil {
		t.Fatal(err)
	}
	if n := fireDue(t, s); n != 0 {
		t.Fatalf("a changed task fired %d ticks from before the change", n)
	}
	clock.Set(t0.Add(180 * time.Second))
	if n := fireDue(t, s); n != 1 {
		t.Fatalf("fired %d at the changed task's first tick", n)
	}
	if got, want := ticks(t, db, "n"), []time.Time{t0.Add(time.Minute), t0.Add(3 * time.Minute)}; !equalTimes(got, want) {
		t.Fatalf("ticks %v, want %v", got, want)
	}
}

func TestCronPauseResumeDelete(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})
	other := newScheduler(t, db, &Config{Clock: clock}) // no factory: never fires
	ctx := t.Context()
	if err := s.AddTask(ctx, Task{Name: "p", Spec: "* * * * *", StreamID: "p"}); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0.Add(time.Minute))
	if n, err := other.FireDue(ctx); err != nil || n != 0 {
		t.Fatalf("a process without the task's factory fired %d, %v", n, err)
	}
	infos, err := other.Tasks(ctx)
	if err != nil || len(infos) != 1 || infos[0].Registered || !infos[0].NextTick.Equal(t0.Add(time.Minute)) {
		t.Fatalf("other.Tasks = %+v, %v; want one overdue, unregistered task", infos, err)
	}
	if n := fireDue(t, s); n != 1 {
		t.Fatalf("fired %d", n)
	}
	if err := other.PauseTask(ctx, "p"); err != nil { // any process may pause
		t.Fatal(err)
	}
	if err := other.PauseTask(ctx, "p"); err != nil {
		t.Fatalf("pausing twice: %v", err)
	}
	clock.Set(t0.Add(5*time.Minute + 30*time.Second))
	if n := fireDue(t, s); n != 0 {
		t.Fatalf("a paused task fired %d", n)
	}
	if infos, _ = s.Tasks(ctx); !infos[0].Paused || !infos[0].NextTick.IsZero() {
		t.Fatalf("Tasks = %+v; want paused with no next tick", infos)
	}
	if err := s.ResumeTask(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if n := fireDue(t, s); n != 0 {
		t.Fatalf("resuming fired %d ticks from the pause", n)
	}
	if infos, _ = s.Tasks(ctx); infos[0].Paused || !infos[0].NextTick.Equal(t0.Add(6*time.Minute)) {
		t.Fatalf("Tasks = %+v; want running, next tick +6 min", infos)
	}
	clock.Set(t0.Add(6 * time.Minute))
	if n := fireDue(t, s); n != 1 {
		t.Fatalf("after resume fired %d, want 1", n)
	}
	if err := s.DeleteTask(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0.Add(7 * time.Minute))
	if n := fireDue(t, s); n != 0 {
		t.Fatalf("a deleted task fired %d", n)
	}
	if got, want := ticks(t, db, "p"), []time.Time{t0.Add(time.Minute), t0.Add(6 * time.Minute)}; !equalTimes(got, want) {
		t.Fatalf("ticks %v, want %v", got, want)
	}
	if n := count(t, db, `SELECT count(*) FROM annals.cron_tasks`) + count(t, db, `SELECT count(*) FROM annals.cron_ticks`); n != 0 {
		t.Error("DeleteTask left rows behind")
	}
	for name, f := range map[string]func() error{
		"pause":  func() error { return s.PauseTask(ctx, "p") },
		"resume": func() error { return s.ResumeTask(ctx, "nope") },
		"delete": func() error { return s.DeleteTask(ctx, "p") },
	} {
		if err := f(); !errors.Is(err, ErrUnknownTask) || !strings.Contains(err.Error(), `no cron task "`) {
			t.Errorf("%s of an unknown task: %v; want ErrUnknownTask", name, err)
		}
	}
	if err := s.PauseTask(ctx, ""); !errors.Is(err, ErrInvalidTask) {
		t.Errorf("PauseTask(\"\") = %v", err)
	}
}

func TestCronCustomEventAndFactoryFailure(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock, RetryBackoff: 5 * time.Second})
	fail := true
	var seen []time.Time
	err := s.AddTask(t.Context(), Task{Name: "report", Spec: "CRON_TZ=Asia/Tokyo 0 9 * * *", StreamID: "reports",
		Event: func(tick time.Time) (eventstore.EventData, error) {
			seen = append(seen, tick)
			if fail {
				fail = false
				return eventstore.EventData{}, errors.New("report service down")
			}
			return eventstore.EventData{Type: "report.due", Data: map[string]string{"day": tick.Format("2006-01-02")}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	due := utc("2026-03-02T00:00:00Z") // 09:00 in Tokyo
	clock.Set(due)
	if n := fireDue(t, s); n != 0 {
		t.Fatalf("a failing factory fired %d", n)
	}
	clock.Set(due.Add(4 * time.Second))
	if n := fireDue(t, s); n != 0 || len(seen) != 1 {
		t.Fatalf("retried before RetryBackoff: fired %d, calls %d", n, len(seen))
	}
	clock.Set(due.Add(5 * time.Second))
	if n := fireDue(t, s); n != 1 {
		t.Fatalf("retry fired %d", n)
	}
	if loc := seen[1].Location().String(); loc != "Asia/Tokyo" || seen[1].Hour() != 9 || !seen[1].Equal(due) {
		t.Errorf("factory got tick %v (%s); want 09:00 Tokyo", seen[1], loc)
	}
	var typ, data, id string
	if err := db.Pool.QueryRow(t.Context(), `SELECT event_type, data::text, event_id::text FROM annals.events`).Scan(&typ, &data, &id); err != nil {
		t.Fatal(err)
	}
	if typ != "report.due" || data != `{"day":"2026-03-02"}` || id != TickEventID("report", due).String() {
		t.Errorf("event %s %s %s", typ, data, id)
	}
	infos, err := s.Tasks(t.Context())
	if err != nil || infos[0].TimeZone != "Asia/Tokyo" || !infos[0].Registered {
		t.Errorf("Tasks = %+v, %v", infos, err)
	}
}

func TestAddTaskRejectsBadInput(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	s := newScheduler(t, db, &Config{Clock: newFakeClock(t0)})
	cases := map[string]struct {
		task Task
		msg  string
	}{
		"empty name":      {Task{Spec: "* * * * *", StreamID: "s"}, "task name is empty"},
		"empty stream":    {Task{Name: "t", Spec: "* * * * *"}, "empty stream ID"},
		"empty spec":      {Task{Name: "t", StreamID: "s"}, "empty cron expression"},
		"bad spec":        {Task{Name: "t", Spec: "61 * * * *", StreamID: "s"}, `cron expression "61 * * * *"`},
		"too many fields": {Task{Name: "t", Spec: "* * * * * * *", StreamID: "s"}, "cron expression"},
		"bad descriptor":  {Task{Name: "t", Spec: "@fortnightly", StreamID: "s"}, "cron expression"},
		"unknown zone":    {Task{Name: "t", Spec: "* * * * *", TimeZone: "Mars/Olympus", StreamID: "s"}, `unknown time zone "Mars/Olympus"`},
		"bad prefix zone": {Task{Name: "t", Spec: "CRON_TZ=Nowhere * * * * *", StreamID: "s"}, `unknown time zone "Nowhere"`},
		"two zones":       {Task{Name: "t", Spec: "CRON_TZ=UTC * * * * *", TimeZone: "Europe/Berlin", StreamID: "s"}, "but TimeZone is"},
		"local zone":      {Task{Name: "t", Spec: "* * * * *", TimeZone: "Local", StreamID: "s"}, `"Local"`},
		"never fires":     {Task{Name: "t", Spec: "0 0 30 2 *", StreamID: "s"}, "never fires"},
		"bad policy":      {Task{Name: "t", Spec: "* * * * *", StreamID: "s", Missed: 7}, "missed-tick policy"},
		// robfig/cron fires these every second (or on the whole second
		// below): not as written.
		"@every 0s":           {Task{Name: "t", Spec: "@every 0s", StreamID: "s"}, "must be positive"},
		"@every -1h":          {Task{Name: "t", Spec: "@every -1h", StreamID: "s"}, "must be positive"},
		"@every 500ms":        {Task{Name: "t", Spec: "@every 500ms", StreamID: "s"}, "at least 1s"},
		"@every 1.5s":         {Task{Name: "t", Spec: "@every 1.5s", StreamID: "s"}, "whole number of seconds"},
		"zoned @every 1m0.1s": {Task{Name: "t", Spec: "CRON_TZ=UTC @every 1m0.1s", StreamID: "s"}, "whole number of seconds"},
	}
	for name, c := range cases {
		err := s.AddTask(t.Context(), c.task)
		if !errors.Is(err, ErrInvalidTask) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v; want ErrInvalidTask saying %q", name, err, c.msg)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM annals.cron_tasks`); n != 0 {
		t.Errorf("%d rejected tasks stored", n)
	}
	if len(s.factories) != 0 {
		t.Error("a rejected task was registered")
	}
	for _, spec := range []string{"@every 1s", "@every 1m30s", "@every 2h", "CRON_TZ=Europe/Berlin @every 90s"} {
		if err := s.AddTask(t.Context(), Task{Name: spec, Spec: spec, StreamID: "s"}); err != nil {
			t.Errorf("AddTask(%q): %v", spec, err)
		}
	}
}

// Even if a task's last tick is set back (an operator's edit, a restore),
// a tick recorded in cron_ticks never fires again.
func TestCronTickRowGuardsAFiredTick(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})
	if err := s.AddTask(t.Context(), Task{Name: "g", Spec: "* * * * *", StreamID: "g"}); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0.Add(time.Minute))
	if n := fireDue(t, s); n != 1 {
		t.Fatalf("fired %d", n)
	}
	if _, err := db.Pool.Exec(t.Context(), `UPDATE annals.cron_tasks SET last_tick = NULL`); err != nil {
		t.Fatal(err)
	}
	if n := fireDue(t, s); n != 0 || s.ticksFired.Load() != 1 || len(ticks(t, db, "g")) != 1 {
		t.Fatalf("a recorded tick fired again: %d now, %d in all", n, s.ticksFired.Load())
	}
	if infos, _ := s.Tasks(t.Context()); infos[0].LastTick == nil || !infos[0].LastTick.Equal(t0.Add(time.Minute)) {
		t.Fatalf("last tick not restored: %+v", infos)
	}
}

// TestCronRecoversFromAFutureLastTick: a dispatcher whose clock ran a day
// ahead fires a tick early and records it as the task's last tick. The
// dispatchers with a right clock used to wait for real time to reach it (the
// task stopped cluster-wide for the day); they now fire by their own clock,
// and the early tick is not appended twice when its time comes.
func TestCronRecoversFromAFutureLastTick(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"*/5 * * * *", "@every 5m"} {
		t.Run(spec, func(t *testing.T) {
			t.Parallel()
			db := annalstest.NewDB(t, nil)
			clock := newFakeClock(t0)
			s := newScheduler(t, db, &Config{Clock: clock, MissedGrace: time.Minute})
			task := Task{Name: "m", Spec: spec, StreamID: "m", Missed: FireLatest}
			if err := s.AddTask(t.Context(), task); err != nil {
				t.Fatal(err)
			}
			ahead := newFakeClock(t0.Add(24 * time.Hour))
			a := newScheduler(t, db, &Config{Clock: ahead, MissedGrace: time.Minute})
			if err := a.AddTask(t.Context(), task); err != nil {
				t.Fatal(err)
			}
			if n := fireDue(t, a); n != 1 {
				t.Fatalf("the dispatcher a day ahead fired %d, want 1", n)
			}
			early := t0.Add(24 * time.Hour)

			clock.Set(t0.Add(5 * time.Minute))
			if n := fireDue(t, s); n != 1 {
				t.Fatalf("at +5 min the right clock fired %d ticks, want 1 (the task waited for the future last tick)", n)
			}
			infos, err := s.Tasks(t.Context())
			if err != nil || len(infos) != 1 || infos[0].LastTick == nil || !infos[0].LastTick.Equal(t0.Add(5*time.Minute)) ||
				!infos[0].NextTick.Equal(t0.Add(10*time.Minute)) {
				t.Fatalf("Tasks = %+v, %v; want last tick +5 min, next +10 min", infos, err)
			}
			clock.Set(t0.Add(10 * time.Minute))
			if n := fireDue(t, s); n != 1 {
				t.Fatalf("at +10 min fired %d, want 1", n)
			}
			// A day later the early tick's time comes: recorded, not again.
			clock.Set(early)
			fireDue(t, s)
			got := ticks(t, db, "m")
			want := []time.Time{early, t0.Add(5 * time.Minute), t0.Add(10 * time.Minute)}
			if !equalTimes(got, want) {
				t.Fatalf("ticks %v, want %v", got, want)
			}
		})
	}
}

// TestCronFutureLastTickAfterPrune: the task's newest tick fired by a right
// clock is kept by PruneTicks however old, and a dispatcher that finds a
// future last tick goes on from it: the tick is not fired a second time
// (with a task's own event IDs, that would be a second event).
func TestCronFutureLastTickAfterPrune(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0.Add(-time.Hour))
	s := newScheduler(t, db, &Config{Clock: clock, MissedGrace: time.Minute, TickRetention: time.Hour})
	n := 0
	task := Task{Name: "d", Spec: "0 12 * * *", StreamID: "d", Missed: FireLatest,
		Event: func(tick time.Time) (eventstore.EventData, error) {
			n++ // an event ID of its own each call
			return eventstore.EventData{Type: "daily.report", Data: map[string]any{"tick": tick, "n": n}}, nil
		}}
	if err := s.AddTask(t.Context(), task); err != nil {
		t.Fatal(err)
	}
	clock.Set(t0) // 12:00
	if got := fireDue(t, s); got != 1 {
		t.Fatalf("fired %d at the first tick, want 1", got)
	}
	clock.Set(t0.Add(3 * time.Hour))
	s.prune(t.Context(), clock.Now()) // the 12:00 tick is older than TickRetention, and the newest
	var kept int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM annals.cron_ticks WHERE task = 'd'`).Scan(&kept); err != nil || kept != 1 {
		t.Fatalf("%d ticks kept by the prune (%v), want the newest", kept, err)
	}
	ahead := newFakeClock(t0.Add(25 * time.Hour))
	a := newScheduler(t, db, &Config{Clock: ahead, MissedGrace: time.Minute, TickRetention: time.Hour})
	if err := a.AddTask(t.Context(), task); err != nil {
		t.Fatal(err)
	}
	if got := fireDue(t, a); got != 1 {
		t.Fatalf("the dispatcher a day ahead fired %d, want 1", got)
	}
	if got := fireDue(t, s); got != 0 {
		t.Fatalf("at 15:00 the right clock fired %d ticks, want 0 (12:00 fired already)", got)
	}
	clock.Set(t0.Add(48 * time.Hour))
	if got := fireDue(t, s); got != 1 {
		t.Fatalf("two days on, fired %d, want 1", got)
	}
	var events int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM annals.events WHERE stream_id = 'd'`).Scan(&events); err != nil || events != 3 {
		t.Fatalf("%d events (%v), want 3: 12:00, the next day's (early), the day after's", events, err)
	}
}

// TestCronFutureActivation: a dispatcher whose clock runs a day ahead
// changes a task's definition, storing its own time as the task's
// activation; the dispatchers with a right clock used to wait a day. They
// now take the database's time of the change instead. (Clocks near real
// time: updated_at is the database's.)
func TestCronFutureActivation(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	start := time.Now().UTC().Truncate(time.Second)
	clock := newFakeClock(start)
	s := newScheduler(t, db, &Config{Clock: clock, MissedGrace: time.Minute})
	if err := s.AddTask(t.Context(), Task{Name: "r", Spec: "*/5 * * * *", StreamID: "r", Missed: FireLatest}); err != nil {
		t.Fatal(err)
	}
	ahead := newFakeClock(start.Add(24 * time.Hour))
	a := newScheduler(t, db, &Config{Clock: ahead, MissedGrace: time.Minute})
	if err := a.AddTask(t.Context(), Task{Name: "r", Spec: "*/10 * * * *", StreamID: "r", Missed: FireLatest}); err != nil {
		t.Fatal(err)
	}
	clock.Set(start.Add(11 * time.Minute)) // a */10 tick lies in between
	if n := fireDue(t, s); n != 1 {
		t.Fatalf("11 minutes after the change the right clock fired %d ticks, want 1 (the task waited for the future activation)", n)
	}
	got := ticks(t, db, "r")
	if len(got) != 1 || got[0].Minute()%10 != 0 || got[0].Before(start) || got[0].After(start.Add(11*time.Minute)) {
		t.Fatalf("ticks %v, want one */10 tick within the 11 minutes", got)
	}
}
