package saga_test

import (
	"context"
	stderrors "errors"
	"fmt"
	"testing"
	"time"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

// The test domain: Added events add N to instance ID, Closed completes it.
// For every Added the counter saga appends an Effect to "effects-<ID>",
// with the exact expected version, so a lost or doubled effect shows in the
// effect stream (and, doubled, as a version conflict).
type Added struct {
	ID string `json:"id"`
	N  int    `json:"n"`
}

type Closed struct {
	ID string `json:"id"`
	// CancelTimer makes the saga cancel its timer with Instance.Cancel
	// before it completes (which cancels it anyway).
	CancelTimer bool `json:"cancel_timer,omitempty"`
}

type Effect struct {
	ID  string `json:"id"`
	Seq int64  `json:"seq"` // the instance's version after the Added
	N   int    `json:"n"`
}

// Deadline is appended by a timer the counter saga schedules on an
// instance's first Added (when it has a scheduler and a TimerAfter).
type Deadline struct {
	ID string `json:"id"`
}

// Expired is appended to "effects-<ID>" when a Deadline reaches an open
// instance, which then completes.
type Expired struct {
	ID string `json:"id"`
}

func registry() *eventstore.Registry {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Added](reg, "test.added")
	eventstore.MustRegister[Closed](reg, "test.closed")
	eventstore.MustRegister[Effect](reg, "test.effect")
	eventstore.MustRegister[Deadline](reg, "test.deadline")
	eventstore.MustRegister[Expired](reg, "test.expired")
	eventstore.MustRegister[Tallied](reg, "test.tallied")
	return reg
}

// Tallied is recorded by the Tally aggregate, which the counter saga
// commands (saga.Create, saga.Update) for every Added when it has a tally
// repository.
type Tallied struct {
	Seq int64 `json:"seq"` // the tally's count after this event
	N   int   `json:"n"`
}

// Tally is an aggregate with a business rule: Add(seq, n) must come in
// sequence (seq = Count+1), so an Add applied twice, or skipped, is refused
// rather than recorded.
type Tally struct {
	aggregate.Base
	Count int64 `json:"count"`
	Sum   int   `json:"sum"`
}

var errOutOfSequence = stderrors.New("tally: out of sequence")

func (t *Tally) Apply(event any) error {
	switch e := event.(type) {
	case Tallied:
		t.Count = e.Seq
		t.Sum += e.N
	default:
		return aggregate.ErrUnhandledEvent
	}
	return nil
}

// Add records n as the seq-th addition.
func (t *Tally) Add(seq int64, n int) error {
	if seq != t.Count+1 {
		return fmt.Errorf("%w: add #%d to a tally at %d", errOutOfSequence, seq, t.Count)
	}
	return aggregate.Record(t, Tallied{Seq: seq, N: n})
}

func tallies(t testing.TB, store *eventstore.Store) *aggregate.Repository[*Tally] {
	t.Helper()
	r, err := aggregate.NewRepository(store, "tally", func() *Tally { return &Tally{} }, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// counterState is the counter saga's state.
type counterState struct {
	Sum int `json:"sum"`
	// Seen lists the handled Added events as "stream@version", in handling order.
	Seen    []string          `json:"seen"`
	Effects int64             `json:"effects"`
	Timer   scheduler.TimerID `json:"timer"`
	// Cancelled is what Instance.Cancel of Timer returned.
	Cancelled bool `json:"cancelled,omitempty"`
}

const counterName = "counter"

// counterSaga returns the counter saga. With timerAfter > 0 it schedules a
// Deadline that far ahead of an instance's first event.
func counterSaga(reg *eventstore.Registry, timerAfter time.Duration) *saga.Typed[counterState] {
	return tallySaga(reg, timerAfter, nil)
}

// tallySaga is the counter saga that, with tally, also commands the Tally
// aggregate "tally-<ID>" for every Added, inside its transaction: the
// effect stream and the tally must then agree, event for event.
func tallySaga(reg *eventstore.Registry, timerAfter time.Duration, tally *aggregate.Repository[*Tally]) *saga.Typed[counterState] {
	s := saga.New[counterState](counterName, reg)
	saga.On(s, func(e eventstore.Envelope[Added]) string { return e.Data.ID },
		func(ctx context.Context, inst *saga.Instance[counterState], e eventstore.Envelope[Added]) error {
			st := &inst.State
			st.Sum += e.Data.N
			st.Seen = append(st.Seen, fmt.Sprintf("%s@%d", e.StreamID, e.StreamVersion))
			st.Effects++
			if _, err := inst.Append(ctx, "effects-"+inst.ID(), eventstore.Exact(st.Effects-1),
				eventstore.NewEvent(Effect{ID: inst.ID(), Seq: inst.Version() + 1, N: e.Data.N})); err != nil {
				return err
			}
			if tally != nil {
				add := func(t *Tally) error { return t.Add(st.Effects, e.Data.N) }
				var err error
				if st.Effects == 1 {
					_, err = saga.Create(ctx, inst, tally, inst.ID(), add)
				} else {
					_, err = saga.Update(ctx, inst, tally, inst.ID(), add)
				}
				if err != nil {
					return err
				}
			}
			if inst.IsNew() && timerAfter > 0 {
				id, err := inst.ScheduleAfter(ctx, timerAfter, "deadlines-"+inst.ID(), eventstore.NewEvent(Deadline{ID: inst.ID()}))
				if err != nil {
					return err
				}
				st.Timer = id
			}
			return nil
		})
	saga.On(s, func(e eventstore.Envelope[Closed]) string { return e.Data.ID },
		func(ctx context.Context, inst *saga.Instance[counterState], e eventstore.Envelope[Closed]) error {
			if e.Data.CancelTimer {
				ok, err := inst.Cancel(ctx, inst.State.Timer)
				if err != nil {
					return err
				}
				inst.State.Cancelled = ok
			}
			inst.Complete()
			return nil
		})
	saga.On(s, func(e eventstore.Envelope[Deadline]) string { return e.Data.ID },
		func(ctx context.Context, inst *saga.Instance[counterState], e eventstore.Envelope[Deadline]) error {
			st := &inst.State
			st.Effects++
			if _, err := inst.Append(ctx, "effects-"+inst.ID(), eventstore.Exact(st.Effects-1),
				eventstore.NewEvent(Expired{ID: inst.ID()})); err != nil {
				return err
			}
			inst.Complete()
			return nil
		})
	return s
}

// bundle is a test database with a store.
type bundle struct {
	db    *annalstest.DB
	store *eventstore.Store
	reg   *eventstore.Registry
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := annalstest.NewDB(t, nil)
	reg := registry()
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{db: db, store: store, reg: reg}
}

// fastRetry retries quickly, twice.
var fastRetry = &projection.RetryPolicy{MaxRetries: 2, InitialDelay: 10 * time.Millisecond, Jitter: -1}

// runner returns a runner with fast retries.
func (b *bundle) runner(t *testing.T) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(b.db.Pool, &projection.Config{Retry: fastRetry, RetryBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// catchUp runs r until it has processed the log's head.
func catchUp(t *testing.T, r *projection.Runner) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) append(t *testing.T, stream string, events ...any) {
	t.Helper()
	evs := make([]eventstore.EventData, len(events))
	for i, e := range events {
		evs[i] = eventstore.NewEvent(e)
	}
	if _, err := b.store.Append(t.Context(), stream, eventstore.Any, evs...); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) lookup(t *testing.T, id string) saga.Stored[counterState] {
	t.Helper()
	st, err := saga.Lookup[counterState](t.Context(), b.db.Pool, "", counterName, id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(t.Context(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	now chan time.Time // a one-slot mutex holding the time
}

func newFakeClock(t time.Time) *fakeClock {
	c := &fakeClock{now: make(chan time.Time, 1)}
	c.now <- t
	return c
}

func (c *fakeClock) Now() time.Time {
	t := <-c.now
	c.now <- t
	return t
}

// After fires at once: the tests drive time by Advance, and the runner's
// retry delays need not wait.
func (c *fakeClock) After(time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	ch <- c.Now()
	return ch
}

func (c *fakeClock) Advance(d time.Duration) {
	t := <-c.now
	c.now <- t.Add(d)
}
