package testkit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

// DefaultSagaStart is the time the fake clock of [ReplaySaga] starts at
// when SagaReplayOptions.Start is zero.
var DefaultSagaStart = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// SagaReplayOptions configures [ReplaySaga]. A nil *SagaReplayOptions means
// defaults.
type SagaReplayOptions struct {
	// ReplayOptions are as for ReplayProjection: Registry (defaulting to
	// the saga's, from saga.New), Stream, Schema, Setup (read models the
	// saga reads), Options, Config and Timeout.
	ReplayOptions
	// Start is the fake clock's time at the start. Defaults to
	// DefaultSagaStart.
	Start time.Time
	// Retention is saga.Config.Retention. Defaults to 0 (keep forever).
	Retention time.Duration
}

// SagaReplay is the outcome of [ReplaySaga]: a fresh database holding the
// input events and everything the saga made of them (instances, effects,
// timers), with a fake clock that Advance moves.
type SagaReplay[S any] struct {
	// DB is the test's database, dropped when the test ends.
	*annalstest.DB
	// Store is an event store on DB with the options' Registry.
	Store *eventstore.Store
	// Scheduler holds the saga's timers; it fires them only in Advance.
	Scheduler *scheduler.Scheduler
	// Clock is the fake clock of the saga and the scheduler.
	Clock *FakeClock

	saga   saga.Saga[S]
	plan   *Replay // argument checking and planning, as ReplayProjection does
	opts   SagaReplayOptions
	inputs map[uuid.UUID]bool
	runSettings
}

// ReplaySaga replays events through a saga, exactly as a production runner
// would (saga.Register on a projection.Runner, RunUntilCaughtUp), in a fresh
// migrated database, with a scheduler on a fake clock, and returns what it
// made of them:
//
//	r := testkit.ReplaySaga(t, orders.Saga(reg), nil,
//		testkit.Stream("order-1", OrderPlaced{OrderID: "1", Amount: 40}))
//	st := r.Instance(t, "1")           // saga.Stored[OrderState]
//	effects := r.Effects(t)            // RequestPayment, ReserveStock, …
//	r.Advance(t, 16*time.Minute)       // the payment deadline fires; the saga handles it
//
// Events are given as to ReplayProjection; a nil opts, or one with no
// Registry, takes the registry the saga was built with (saga.New). The first handler error or panic
// fails the test, quoting it (no retries, projection.Stop, unless
// Options says otherwise), as does every other mistake.
func ReplaySaga[S any](t testing.TB, s saga.Saga[S], opts *SagaReplayOptions, events ...any) *SagaReplay[S] {
	t.Helper()
	if isNilHandler(s) {
		t.Fatalf("testkit: ReplaySaga with a nil saga (%T)", s)
		return nil
	}
	r := &SagaReplay[S]{saga: s, inputs: map[uuid.UUID]bool{}}
	if opts != nil {
		r.opts = *opts
	}
	if r.opts.Start.IsZero() {
		r.opts.Start = DefaultSagaStart
	}
	r.defaults(&r.opts.ReplayOptions, s)
	r.plan = &Replay{opts: r.opts.ReplayOptions}
	r.plan.regName = r.regName
	appends, err := r.plan.plan(events)
	if err != nil {
		t.Fatalf("testkit: %v", err)
		return nil
	}
	r.DB = annalstest.NewDB(t, &annalstest.Options{Schema: r.opts.Schema})
	r.cfg.Schema = r.DB.Schema
	if r.Store, err = eventstore.New(r.DB.Pool, &eventstore.Config{Schema: r.DB.Schema, Registry: r.opts.Registry}); err != nil {
		t.Fatalf("testkit: %v", err)
		return nil
	}
	r.Clock = NewFakeClock(r.opts.Start)
	if r.Scheduler, err = scheduler.New(r.Store, &scheduler.Config{Clock: r.Clock}); err != nil {
		t.Fatalf("testkit: %v", err)
		return nil
	}
	ctx, cancel := context.WithTimeout(t.Context(), r.opts.Timeout)
	defer cancel()
	if r.opts.Setup != nil {
		if err := pgx.BeginFunc(ctx, r.DB.Pool, func(tx pgx.Tx) error { return r.opts.Setup(ctx, tx) }); err != nil {
			t.Fatalf("testkit: Setup: %v", err)
			return nil
		}
	}
	if err := r.replay(ctx, appends); err != nil {
		t.Fatalf("testkit: %v", err)
		return nil
	}
	return r
}

// Append appends more events and runs the saga to the new head.
func (r *SagaReplay[S]) Append(t testing.TB, events ...any) {
	t.Helper()
	appends, err := r.plan.plan(events)
	if err != nil {
		t.Fatalf("testkit: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), r.opts.Timeout)
	defer cancel()
	if err := r.replay(ctx, appends); err != nil {
		t.Fatalf("testkit: %v", err)
	}
}

// maxAdvanceSteps bounds the due times one Advance steps through: a saga
// whose timers keep scheduling timers due at once would otherwise loop.
const maxAdvanceSteps = 10000

// Advance moves the fake clock forward by d as time would pass: it steps
// the clock through each pending timer's due time and each tick of the cron
// tasks added to Scheduler (registered in it and not paused) up to
// Now()+d, in order, and at each fires what is due then and runs the saga
// to the head. So a handler sees Now() equal to the due time of the timer
// whose event it handles, a timer that a handler schedules within the
// window fires in it too, and a task fires every tick that falls in the
// window (a daily task, three ticks for Advance(72h)), whatever its
// MissedPolicy, as a dispatcher that never stopped would. Then it sets the
// clock to Now()+d and returns how many timers and ticks fired in all. A
// negative d, a timer or tick that is due but does not fire (a task's Event
// that fails is retried only after Config.RetryBackoff), or more than 10000
// due times in the window, fails the test.
func (r *SagaReplay[S]) Advance(t testing.TB, d time.Duration) int {
	t.Helper()
	if d < 0 {
		t.Fatalf("testkit: Advance(%v): the clock only moves forward", d)
		return 0
	}
	target := r.Clock.Now().Add(d)
	ctx, cancel := context.WithTimeout(t.Context(), r.opts.Timeout)
	defer cancel()
	fired := 0
	var stuck *time.Time // the due time of the last pass that fired nothing
	for step := 0; ; step++ {
		next, err := r.nextDue(ctx)
		if err != nil {
			t.Fatalf("testkit: %v", err)
			return fired
		}
		if next == nil || next.After(target) {
			break
		}
		if step == maxAdvanceSteps {
			t.Fatalf("testkit: Advance(%v): still timers or cron ticks due at %v after %d passes; "+
				"does a handler schedule timers due at once forever, or a task tick more often than that in the window?",
				d, next, step)
			return fired
		}
		if stuck != nil && stuck.Equal(*next) {
			t.Fatalf("testkit: Advance(%v): a timer or cron tick due at %v does not fire "+
				"(held by another dispatcher, or a task's Event fails?)", d, next)
			return fired
		}
		r.Clock.advanceTo(*next)
		n, err := r.fire(ctx)
		fired += n
		if err != nil {
			t.Fatalf("testkit: %v", err)
			return fired
		}
		stuck = nil
		if n == 0 {
			stuck = next
		}
	}
	r.Clock.advanceTo(target)
	n, err := r.fire(ctx)
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	return fired + n
}

// nextDue returns the earliest due time of a pending timer or of the next
// tick of a cron task this Scheduler fires (registered, not paused); nil if
// there is none.
func (r *SagaReplay[S]) nextDue(ctx context.Context) (*time.Time, error) {
	st, err := r.Scheduler.TimerStats(ctx)
	if err != nil {
		return nil, err
	}
	next := st.NextDue
	tasks, err := r.Scheduler.Tasks(ctx)
	if err != nil {
		return nil, err
	}
	for _, task := range tasks {
		if !task.Registered || task.Paused || task.NextTick.IsZero() {
			continue
		}
		if next == nil || task.NextTick.Before(*next) {
			tick := task.NextTick
			next = &tick
		}
	}
	return next, nil
}

// fire fires what is due by the clock's time and runs the saga to the head.
func (r *SagaReplay[S]) fire(ctx context.Context) (int, error) {
	n, err := r.Scheduler.FireDue(ctx)
	if err != nil {
		return n, errors.Wrap(err, "fire due timers")
	}
	return n, r.replay(ctx, nil)
}

// Instance returns the stored instance id; a missing one fails the test
// (Find tells whether there is one).
func (r *SagaReplay[S]) Instance(t testing.TB, id string) saga.Stored[S] {
	t.Helper()
	st, err := saga.Lookup[S](t.Context(), r.DB.Pool, r.DB.Schema, r.saga.Name(), id)
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	return st
}

// Find returns the stored instance id and true, or false when the saga
// has no such instance (to check that an event started none).
func (r *SagaReplay[S]) Find(t testing.TB, id string) (saga.Stored[S], bool) {
	t.Helper()
	st, err := saga.Lookup[S](t.Context(), r.DB.Pool, r.DB.Schema, r.saga.Name(), id)
	if errors.Is(err, saga.ErrNotFound) {
		return st, false
	}
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	return st, true
}

// Effects returns every event in the log that the test did not append: what
// the saga appended, and what its timers appended, in log order.
func (r *SagaReplay[S]) Effects(t testing.TB) []eventstore.Event {
	t.Helper()
	var out []eventstore.Event
	for e, err := range r.Store.ReadAll(t.Context(), 0) {
		if err != nil {
			t.Fatalf("testkit: read the log: %v", err)
			return nil
		}
		if !r.inputs[e.ID] {
			out = append(out, e)
		}
	}
	return out
}

// Timers returns the pending timers, by due time.
func (r *SagaReplay[S]) Timers(t testing.TB) []scheduler.TimerInfo {
	t.Helper()
	ts, err := r.Scheduler.Timers(t.Context(), 1000)
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	return ts
}

// replay appends the inputs and runs the saga to the head.
func (r *SagaReplay[S]) replay(ctx context.Context, appends []pendingAppend) error {
	if len(appends) > 0 {
		results, err := r.Store.Transact(ctx, func(_ context.Context, _ pgx.Tx, b *eventstore.Batch) error {
			for _, a := range appends {
				if err := b.Append(a.stream, eventstore.Any, a.events...); err != nil {
					return errors.Wrapf(err, "append to %q", a.stream)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, res := range results {
			for _, e := range res.Events {
				r.inputs[e.ID] = true
			}
		}
	}
	runner, err := projection.NewRunner(r.DB.Pool, &r.cfg)
	if err != nil {
		return err
	}
	reg := r.reg
	if err := saga.Register(runner, r.saga, &saga.Config{Store: r.Store, Scheduler: r.Scheduler, Clock: r.Clock,
		Retention: r.opts.Retention, Options: &reg}); err != nil {
		return err
	}
	return r.result(runner.RunUntilCaughtUp(ctx))
}

// FakeClock is a clock that moves only when told; it satisfies
// projection.Clock and scheduler.Clock. Safe for concurrent use.
type FakeClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewFakeClock returns a FakeClock at t.
func NewFakeClock(t time.Time) *FakeClock { return &FakeClock{now: t} }

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that has the clock's time at once: waits on a
// FakeClock do not block (tests move time with Advance).
func (c *FakeClock) After(time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	ch <- c.Now()
	return ch
}

// Advance moves the clock forward by d.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// advanceTo moves the clock to t, unless it is already later.
func (c *FakeClock) advanceTo(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
}
