package scheduler

import (
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// A task whose Event func takes longer than ClaimTimeout fires: the func
// runs before the claim's transaction begins. It used to run inside it, so
// the server ended the session as idle in transaction, and the task never
// fired, retried every RetryBackoff with a misleading database error.
func TestSlowEventFuncOutlastingClaimTimeoutFires(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	const claimTimeout = 200 * time.Millisecond
	s := newScheduler(t, db, &Config{Clock: clock, ClaimTimeout: claimTimeout})
	calls := 0
	if err := s.AddTask(t.Context(), Task{Name: "slow", Spec: "* * * * *", StreamID: "slow",
		Event: func(time.Time) (eventstore.EventData, error) {
			calls++
			time.Sleep(3 * claimTimeout) // slow user code, not a wait for a condition
			return ev("slow.tick", map[string]any{}), nil
		}}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if n, err := s.FireDue(t.Context()); n != 1 || err != nil {
		t.Fatalf("FireDue = %d, %v; want the tick fired", n, err)
	}
	if got := eventsIn(t, db, "slow"); got != 1 || calls != 1 {
		t.Errorf("%d events after %d Event calls; want 1 and 1", got, calls)
	}
	s.mu.Lock()
	retry, failing := s.retries["slow"]
	s.mu.Unlock()
	if failing {
		t.Errorf("the task is backing off after a successful tick: %+v", retry)
	}
}

// The Event func runs before the task's row is locked, so another
// dispatcher may fire the tick meanwhile: the locked re-read sees it fired,
// and the tick is appended once.
func TestTickFiredByAnotherDispatcherWhileTheEventFuncRuns(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	a := newScheduler(t, db, &Config{Clock: clock})
	b := newScheduler(t, db, &Config{Clock: clock})
	task := Task{Name: "raced", Spec: "* * * * *", StreamID: "raced"}
	if err := b.AddTask(t.Context(), task); err != nil {
		t.Fatal(err)
	}
	var bFired int
	var bErr error
	task.Event = func(tick time.Time) (eventstore.EventData, error) {
		if bFired == 0 && bErr == nil {
			bFired, bErr = b.FireDue(t.Context()) // b fires the tick while a's Event func runs
		}
		return eventstore.EventData{Type: TickEventType, Data: TickData{Task: "raced", Tick: tick.UTC()}}, nil
	}
	if err := a.AddTask(t.Context(), task); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if n := fireDue(t, a); n != 0 || bFired != 1 || bErr != nil {
		t.Fatalf("a fired %d, b %d (%v); want b's tick only", n, bFired, bErr)
	}
	clock.Advance(time.Minute)
	if n := fireDue(t, a); n != 1 {
		t.Errorf("a fired %d at the next tick, want 1", n)
	}
	if got, want := ticks(t, db, "raced"), []time.Time{t0.Add(time.Minute), t0.Add(2 * time.Minute)}; !equalTimes(got, want) {
		t.Errorf("ticks %v, want %v", got, want)
	}
}
