package scheduler

import (
	stderrors "errors"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

func TestTimerFiresWhenDueByTheClock(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})

	id, err := s.Schedule(t.Context(), nil, t0.Add(30*time.Minute), "order-1", ev("order.expired", map[string]any{"order": 1}))
	if err != nil {
		t.Fatal(err)
	}
	if id.Version() != 7 {
		t.Errorf("timer ID %s is UUID version %d, want 7", id, id.Version())
	}
	clock.Advance(29 * time.Minute)
	if n := fireDue(t, s); n != 0 || eventsIn(t, db, "order-1") != 0 {
		t.Fatalf("at +29 min FireDue fired %d, events %d; want nothing", n, eventsIn(t, db, "order-1"))
	}
	clock.Advance(time.Minute - time.Microsecond)
	if n := fireDue(t, s); n != 0 {
		t.Fatalf("1 µs before due FireDue fired %d", n)
	}
	clock.Advance(time.Microsecond)
	if n := fireDue(t, s); n != 1 {
		t.Fatalf("at +30 min FireDue fired %d, want 1", n)
	}
	if got := eventsIn(t, db, "order-1"); got != 1 {
		t.Fatalf("events in order-1 = %d, want 1", got)
	}
	if timerRows(t, db) != 0 {
		t.Error("the fired timer's row is still there")
	}
	if n := fireDue(t, s); n != 0 || eventsIn(t, db, "order-1") != 1 {
		t.Errorf("second pass fired %d more", n)
	}
	var typ, data string
	if err := db.Pool.QueryRow(t.Context(), `SELECT event_type, data::text FROM annals.events`).Scan(&typ, &data); err != nil {
		t.Fatal(err)
	}
	if typ != "order.expired" || data != `{"order":1}` { // as encoding/json wrote it
		t.Errorf("event = %s %s", typ, data)
	}
}

func TestTimerRunFiresWhenTheFakeClockAdvances(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock, PollInterval: time.Hour})
	if _, err := s.Schedule(t.Context(), nil, t0.Add(30*time.Minute), "o", ev("x", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	run(t, s)
	annalstest.WaitFor(t, 10*time.Second, func() bool { return s.sleeping.Load() > 0 })
	// At +29 min the timer is not due: wake the dispatcher and let it look
	// and go back to sleep, then check that it fired nothing.
	clock.Advance(29 * time.Minute)
	before := s.sleeping.Load()
	s.signal()
	annalstest.WaitFor(t, 10*time.Second, func() bool { return s.sleeping.Load() > before })
	if eventsIn(t, db, "o") != 0 {
		t.Fatal("timer fired at +29 min")
	}
	clock.Advance(time.Minute)
	annalstest.WaitFor(t, 10*time.Second, func() bool { return eventsIn(t, db, "o") == 1 })
	annalstest.WaitFor(t, 10*time.Second, func() bool { return timerRows(t, db) == 0 })
}

func TestTimerInThePastFiresAtOnce(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock, PollInterval: time.Hour})
	run(t, s)
	if _, err := s.Schedule(t.Context(), nil, t0.Add(-time.Hour), "past", ev("x", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return eventsIn(t, db, "past") == 1 })
}

func TestNotifyWakesASleepingDispatcher(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock, PollInterval: time.Hour})
	other := newScheduler(t, db, &Config{Clock: clock}) // another process; does not run a dispatcher
	// A far timer: the dispatcher sleeps until then (by the fake clock).
	if _, err := other.Schedule(t.Context(), nil, t0.Add(50*time.Minute), "far", ev("x", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	run(t, s)
	// Asleep after the wake-up that LISTEN's start causes: 2 sleeps.
	annalstest.WaitFor(t, 10*time.Second, func() bool { return s.listenUp.Load() && s.sleeping.Load() >= 2 })
	// A nearer timer, already due, scheduled by the other process inside a
	// transaction: only the NOTIFY sent at its commit can wake s.
	tx, err := db.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Schedule(t.Context(), tx, t0, "near", ev("x", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return eventsIn(t, db, "near") == 1 })
	if s.notified.Load() == 0 {
		t.Error("the dispatcher fired the timer without a notification")
	}
	if eventsIn(t, db, "far") != 0 {
		t.Error("the far timer fired")
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})
	ctx := t.Context()

	id, err := s.Schedule(ctx, nil, t0.Add(time.Minute), "c", ev("x", map[string]any{}))
	if err != nil {
		t.Fatal(err)
	}
	keep, err := s.Schedule(ctx, nil, t0.Add(time.Minute), "k", ev("x", map[string]any{}))
	if err != nil {
		t.Fatal(err)
	}
	// Cancel in a transaction that rolls back: nothing changes.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Cancel(ctx, tx, id); err != nil || !ok {
		t.Fatalf("Cancel in tx = %v, %v", ok, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if timerRows(t, db) != 2 {
		t.Fatal("a rolled-back Cancel deleted the timer")
	}
	if ok, err := s.Cancel(ctx, nil, id); err != nil || !ok {
		t.Fatalf("Cancel = %v, %v; want true", ok, err)
	}
	if ok, err := s.Cancel(ctx, nil, id); err != nil || ok {
		t.Fatalf("second Cancel = %v, %v; want false", ok, err)
	}
	if ok, err := s.Cancel(ctx, nil, uuid.New()); err != nil || ok {
		t.Fatalf("Cancel of an unknown ID = %v, %v; want false", ok, err)
	}
	clock.Advance(time.Hour)
	if n := fireDue(t, s); n != 1 {
		t.Fatalf("FireDue fired %d, want 1 (the other timer)", n)
	}
	if eventsIn(t, db, "c") != 0 || eventsIn(t, db, "k") != 1 {
		t.Fatal("the cancelled timer fired, or the kept one did not")
	}
	if ok, err := s.Cancel(ctx, nil, keep); err != nil || ok {
		t.Fatalf("Cancel of a fired timer = %v, %v; want false", ok, err)
	}
}

func TestCancelOwned(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})
	ctx := t.Context()
	for i, owner := range []string{"saga:a", "saga:a", "saga:b", ""} {
		if _, err := s.ScheduleTimer(ctx, nil, Timer{At: t0.Add(time.Duration(i) * time.Second), StreamID: "s-" + owner,
			Events: []eventstore.EventData{ev("x", map[string]any{})}, Owner: owner}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.CancelOwned(ctx, nil, "saga:a"); err != nil || n != 2 {
		t.Fatalf("CancelOwned = %d, %v; want 2", n, err)
	}
	if n, err := s.CancelOwned(ctx, nil, "saga:a"); err != nil || n != 0 {
		t.Fatalf("second CancelOwned = %d, %v; want 0", n, err)
	}
	if _, err := s.CancelOwned(ctx, nil, ""); !errors.Is(err, ErrInvalidTimer) {
		t.Fatalf("CancelOwned(\"\") = %v; want ErrInvalidTimer", err)
	}
	clock.Advance(time.Hour)
	if n := fireDue(t, s); n != 2 {
		t.Fatalf("fired %d, want 2", n)
	}
	if eventsIn(t, db, "s-saga:a") != 0 || eventsIn(t, db, "s-saga:b") != 1 || eventsIn(t, db, "s-") != 1 {
		t.Error("wrong timers fired")
	}
}

func TestScheduleInATransaction(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})
	ctx := t.Context()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Schedule(ctx, tx, t0, "rolled-back", ev("x", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if timerRows(t, db) != 0 || fireDue(t, s) != 0 {
		t.Fatal("a timer scheduled in a rolled-back transaction exists")
	}
	tx, err = db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Schedule(ctx, tx, t0, "committed", ev("x", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := fireDue(t, s); n != 1 || eventsIn(t, db, "committed") != 1 {
		t.Fatalf("fired %d", n)
	}
}

func TestScheduleRejectsBadInput(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	s := newScheduler(t, db, nil)
	ctx := t.Context()
	e := ev("x", map[string]any{})
	cases := []struct {
		name string
		t    Timer
		also error
	}{
		{"no time", Timer{StreamID: "s", Events: []eventstore.EventData{e}}, nil},
		{"empty stream", Timer{At: t0, Events: []eventstore.EventData{e}}, eventstore.ErrInvalidEvent},
		{"no events", Timer{At: t0, StreamID: "s"}, eventstore.ErrInvalidEvent},
		{"bad data", Timer{At: t0, StreamID: "s", Events: []eventstore.EventData{ev("x", "a string")}}, eventstore.ErrInvalidEvent},
		{"no type", Timer{At: t0, StreamID: "s", Events: []eventstore.EventData{{Data: struct{}{}}}}, eventstore.ErrUnknownEventType},
		{"bad expected", Timer{At: t0, StreamID: "s", Expected: -7, Events: []eventstore.EventData{e}}, eventstore.ErrInvalidEvent},
		{"two expectations", Timer{At: t0, StreamID: "s", Expected: 3, ExpectNoStream: true, Events: []eventstore.EventData{e}}, nil},
	}
	for _, c := range cases {
		_, err := s.ScheduleTimer(ctx, nil, c.t)
		// The standard library's errors.Is sees the same (most callers use it).
		if !errors.Is(err, ErrInvalidTimer) || (c.also != nil && !errors.Is(err, c.also)) ||
			!stderrors.Is(err, ErrInvalidTimer) || (c.also != nil && !stderrors.Is(err, c.also)) {
			t.Errorf("%s: err = %v; want ErrInvalidTimer and %v", c.name, err, c.also)
		}
	}
	if timerRows(t, db) != 0 {
		t.Error("a rejected timer was stored")
	}
	if _, err := s.Timers(ctx, 0); !errors.Is(err, ErrInvalidTimer) {
		t.Errorf("Timers(0) = %v", err)
	}
	if _, err := New(nil, nil); err == nil {
		t.Error("New(nil store) accepted")
	}
	if _, err := New(s.store, &Config{BatchSize: -1}); err == nil {
		t.Error("negative BatchSize accepted")
	}
	if _, err := New(s.store, &Config{Schema: "other"}); err == nil {
		t.Error("a schema other than the store's accepted")
	}
}

func TestListenerReconnectsAfterItsConnectionIsKilled(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock, PollInterval: time.Hour})
	run(t, s)
	annalstest.WaitFor(t, 10*time.Second, func() bool { return s.listenUp.Load() && s.sleeping.Load() > 0 })
	pid := s.listenPID.Load()
	var ok bool
	if err := db.Pool.QueryRow(t.Context(), `SELECT pg_terminate_backend($1, 5000)`, int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend = %v, %v", ok, err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		return s.reconnects.Load() > 0 && s.listenUp.Load() && s.listenPID.Load() != pid
	})
	// The new connection listens: a timer scheduled by another process is
	// announced to it, and fires.
	before := s.notified.Load()
	other := newScheduler(t, db, &Config{Clock: clock})
	if _, err := other.Schedule(t.Context(), nil, t0, "after-reconnect", ev("x", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return s.notified.Load() > before })
	annalstest.WaitFor(t, 10*time.Second, func() bool { return eventsIn(t, db, "after-reconnect") == 1 })
}
