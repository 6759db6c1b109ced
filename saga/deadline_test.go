package saga_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

// Deadlines with a fake clock shared by the saga and the scheduler: the
// counter saga schedules a Deadline 10 minutes after an instance's first
// event; a Deadline that reaches an open instance appends Expired and
// completes it.
func TestDeadlines(t *testing.T) {
	t.Parallel()

	type fixture struct {
		*bundle
		clock *fakeClock
		sched *scheduler.Scheduler
		run   func()
	}
	setupDeadlines := func(t *testing.T) fixture {
		b := setup(t)
		clock := newFakeClock(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
		sched, err := scheduler.New(b.store, &scheduler.Config{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		r := b.runner(t)
		register(t, r, counterSaga(b.reg, 10*time.Minute), &saga.Config{Store: b.store, Scheduler: sched, Clock: clock})
		return fixture{bundle: b, clock: clock, sched: sched, run: func() { catchUp(t, r) }}
	}
	fire := func(t *testing.T, f fixture) int {
		t.Helper()
		n, err := f.sched.FireDue(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("FiresAndTheSagaHandlesIt", func(t *testing.T) {
		t.Parallel()
		f := setupDeadlines(t)
		f.append(t, "orders", Added{ID: "a", N: 1})
		f.run()
		st := f.lookup(t, "a")
		if st.State.Timer == uuid.Nil {
			t.Fatalf("no timer stored in the state: %+v", st)
		}
		if n := f.count(t, `SELECT count(*) FROM annals.timers WHERE owner = $1 AND due_at = $2`, "saga:7:counter:a", f.clock.Now().Add(10*time.Minute)); n != 1 {
			t.Fatalf("%d timers of instance a due in 10 minutes, want 1", n)
		}
		f.clock.Advance(9 * time.Minute)
		if n := fire(t, f); n != 0 {
			t.Fatalf("%d timers fired 9 minutes in; the deadline is at 10", n)
		}
		f.clock.Advance(2 * time.Minute)
		if n := fire(t, f); n != 1 {
			t.Fatalf("%d timers fired 11 minutes in, want 1", n)
		}
		f.run()
		st = f.lookup(t, "a")
		if !st.Completed || st.State.Effects != 2 {
			t.Fatalf("instance a after its deadline: %+v; want completed with the Expired effect", st)
		}
		effects := f.effects(t, "a")
		if len(effects) != 2 || effects[1].Type != "test.expired" {
			t.Fatalf("effects %+v; want Effect, Expired", effects)
		}
		// The Deadline event was caused by the event that scheduled it.
		var cause string
		if err := f.db.Pool.QueryRow(t.Context(), `SELECT metadata->>'causation_id' FROM annals.events WHERE event_type = 'test.deadline'`).Scan(&cause); err != nil {
			t.Fatal(err)
		}
		var first string
		if err := f.db.Pool.QueryRow(t.Context(), `SELECT event_id::text FROM annals.events WHERE event_type = 'test.added'`).Scan(&first); err != nil || cause != first {
			t.Fatalf("the deadline's causation is %q, want the Added %q (%v)", cause, first, err)
		}
	})

	t.Run("CompletingCancelsTheTimer", func(t *testing.T) {
		t.Parallel()
		f := setupDeadlines(t)
		f.append(t, "orders", Added{ID: "b", N: 1})
		f.run()
		f.append(t, "orders", Closed{ID: "b"})
		f.run()
		if n := f.count(t, `SELECT count(*) FROM annals.timers`); n != 0 {
			t.Fatalf("%d timers left after the instance completed", n)
		}
		f.clock.Advance(time.Hour)
		if n := fire(t, f); n != 0 {
			t.Fatalf("%d timers fired after the instance completed", n)
		}
		f.run()
		if n := f.count(t, `SELECT count(*) FROM annals.events WHERE event_type IN ('test.deadline', 'test.expired')`); n != 0 {
			t.Fatalf("%d deadline or expiry events in the log", n)
		}
		if st := f.lookup(t, "b"); !st.Completed || st.State.Effects != 1 || st.State.Cancelled {
			t.Fatalf("instance b: %+v", st)
		}
	})

	t.Run("CancelByID", func(t *testing.T) {
		t.Parallel()
		f := setupDeadlines(t)
		f.append(t, "orders", Added{ID: "c", N: 1}, Added{ID: "d", N: 1})
		f.run()
		f.append(t, "orders", Closed{ID: "c", CancelTimer: true})
		f.run()
		if st := f.lookup(t, "c"); !st.State.Cancelled {
			t.Fatalf("instance c: Cancel of its timer did not report true: %+v", st)
		}
		// d's timer is untouched.
		if n := f.count(t, `SELECT count(*) FROM annals.timers WHERE owner = $1`, saga.Owner(counterName, "d")); n != 1 {
			t.Fatalf("instance d has %d timers, want 1", n)
		}
		f.clock.Advance(time.Hour)
		if n := fire(t, f); n != 1 {
			t.Fatalf("%d timers fired, want only d's", n)
		}
	})

	t.Run("TimerRollsBackWithTheHandler", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		clock := newFakeClock(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
		sched, err := scheduler.New(b.store, &scheduler.Config{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		r := b.runner(t)
		// The first attempt of every event fails after the handler ran (and
		// scheduled): its timer and effect must roll back with it.
		register(t, r, &failOnce{Saga: counterSaga(b.reg, 10*time.Minute), seen: map[string]bool{}},
			&saga.Config{Store: b.store, Scheduler: sched, Clock: clock})
		b.append(t, "orders", Added{ID: "e", N: 1})
		catchUp(t, r)
		if n := b.count(t, `SELECT count(*) FROM annals.timers`); n != 1 {
			t.Fatalf("%d timers after a failed and a successful attempt, want 1", n)
		}
		if n := len(b.effects(t, "e")); n != 1 {
			t.Fatalf("%d effects, want 1", n)
		}
	})
}

// failOnce wraps a saga: the first attempt at each event runs the handler
// (effects included) and then fails.
type failOnce struct {
	saga.Saga[counterState]
	seen map[string]bool
}

func (s *failOnce) Handle(ctx context.Context, inst *saga.Instance[counterState], e eventstore.Event) error {
	if err := s.Saga.Handle(ctx, inst, e); err != nil {
		return err
	}
	if !s.seen[e.ID.String()] {
		s.seen[e.ID.String()] = true
		return errors.New("the first attempt fails after its effects")
	}
	return nil
}
