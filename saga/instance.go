package saga

import (
	"context"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/failure"
	"github.com/annals-dev/annals/scheduler"
)

// Instance is one saga instance while its handler runs: its state, what
// caused this call, and its effects. Effects run in the runner's batch
// transaction, so they commit together with the new state and the
// checkpoint, or not at all. An Instance is valid only during the Handle
// call it was passed to.
type Instance[S any] struct {
	// State is the instance's state: the zero value for a new instance, else
	// what the previous Handle left. Change it in place; it is saved when
	// Handle returns nil.
	State S

	id        string
	isNew     bool
	version   int64
	event     eventstore.Event
	tx        pgx.Tx
	rt        *runtime
	completed bool
	done      bool // Handle has returned: no more effects
}

// ID returns the instance's correlation ID.
func (i *Instance[S]) ID() string { return i.id }

// IsNew reports whether this event starts the instance (no state was
// stored for its ID).
func (i *Instance[S]) IsNew() bool { return i.isNew }

// Version returns the number of events the instance had handled before this
// one: 0 for a new instance. It is the stored row's version.
func (i *Instance[S]) Version() int64 { return i.version }

// Event returns the event being handled.
func (i *Instance[S]) Event() eventstore.Event { return i.event }

// Now returns the configured clock's time (Config.Clock).
func (i *Instance[S]) Now() time.Time { return i.rt.clock.Now() }

// Tx returns the batch transaction, for reading read models in the same
// snapshot. Do not commit or roll it back: the runner does, together with
// the saga's state and checkpoint.
func (i *Instance[S]) Tx() pgx.Tx { return i.tx }

// Complete marks the instance completed: when Handle returns nil its state
// is saved as final, its pending timers are cancelled, and every later event
// correlated to its ID is ignored (until Config.Retention prunes the row).
func (i *Instance[S]) Complete() { i.completed = true }

// Completed reports whether Complete was called.
func (i *Instance[S]) Completed() bool { return i.completed }

// Owner returns the scheduler owner tag of the instance's timers:
// saga.Owner(name, id), "saga:<len(name)>:<name>:<id>" (or its hash, when
// that tag cannot be a timer's owner: see Owner).
func (i *Instance[S]) Owner() string { return i.rt.owner(i.id) }

func (i *Instance[S]) live() error {
	if i.done {
		return errors.Newf("saga %q instance %q: effect after Handle returned", i.rt.name, i.id)
	}
	return nil
}

// Append appends events to streamID in the batch transaction, if the
// stream's version matches expected. Each event's metadata gets, where it
// is empty, CausationID = the handled event's ID and the handled event's
// CorrelationID (or, if it has none, its ID). An error (for instance
// eventstore.ErrWrongExpectedVersion) should be returned from Handle: the
// transaction is not usable after a failed statement.
func (i *Instance[S]) Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	if err := i.live(); err != nil {
		return eventstore.AppendResult{}, err
	}
	i.rt.appended(i.event.ID) // even if it fails: the lock may be taken
	res, err := i.rt.store.AppendTx(ctx, i.tx, streamID, expected, i.stamp(events)...)
	return res, errors.Wrapf(err, "append to %q", streamID)
}

// Schedule stores a timer that appends events to streamID at time at
// (whatever the stream's version then), owned by the instance: Complete
// cancels it. The events' metadata is filled as Append does. Keep the
// returned ID in State to Cancel it later.
func (i *Instance[S]) Schedule(ctx context.Context, at time.Time, streamID string, events ...eventstore.EventData) (scheduler.TimerID, error) {
	return i.ScheduleTimer(ctx, scheduler.Timer{At: at, StreamID: streamID, Expected: eventstore.Any, Events: events})
}

// ScheduleAfter is Schedule at Now() + d: a deadline.
func (i *Instance[S]) ScheduleAfter(ctx context.Context, d time.Duration, streamID string, events ...eventstore.EventData) (scheduler.TimerID, error) {
	return i.Schedule(ctx, i.Now().Add(d), streamID, events...)
}

// ScheduleTimer stores t (its Owner is set to the instance's, see Owner),
// for control over the expected version.
//
// A timer the scheduler refuses as invalid (scheduler.ErrInvalidTimer: an
// event type not in the registry, bad event data, an empty stream ID, no
// events, a zero due time or one outside the years 1 to 9999, both
// ExpectNoStream and Expected) fails for good: the error is marked
// failure.Permanent, so that, returned from Handle, the event is
// dead-lettered after one attempt. No retry could mend it (the handler
// makes the same timer from the same event and state); fix the code and
// retry the dead letter (annals dlq retry).
func (i *Instance[S]) ScheduleTimer(ctx context.Context, t scheduler.Timer) (scheduler.TimerID, error) {
	if err := i.live(); err != nil {
		return scheduler.TimerID{}, err
	}
	if i.rt.sched == nil {
		return scheduler.TimerID{}, errors.Wrap(ErrNoScheduler, "schedule")
	}
	t.Owner = i.Owner()
	t.Events = i.stamp(t.Events)
	id, err := i.rt.sched.ScheduleTimer(ctx, i.tx, t)
	if errors.Is(err, scheduler.ErrInvalidTimer) {
		return id, failure.Permanent(errors.Wrap(err, "schedule a timer"))
	}
	return id, errors.Wrap(err, "schedule a timer")
}

// Cancel cancels a pending timer and reports whether it did, in the
// handler's transaction (scheduler.Scheduler.Cancel). A timer a dispatcher
// is firing at this moment is waited for: if its append succeeds, the timer
// has fired and Cancel reports false (its events will reach the saga, which
// should then ignore them, checking the state, or have completed); if it
// fails, Cancel deletes the timer. When that dispatcher waits for the log's
// append lock that this handler's own appends hold, PostgreSQL breaks the
// deadlock within its deadlock_timeout: either the dispatcher's append fails
// (the timer is cancelled) or Cancel fails with scheduler.ErrTimerBusy, the
// handler's attempt fails, and the event is tried again.
func (i *Instance[S]) Cancel(ctx context.Context, id scheduler.TimerID) (bool, error) {
	if err := i.live(); err != nil {
		return false, err
	}
	if i.rt.sched == nil {
		return false, errors.Wrap(ErrNoScheduler, "cancel")
	}
	ok, err := i.rt.sched.Cancel(ctx, i.tx, id)
	return ok, errors.Wrapf(err, "cancel timer %s", id)
}

// stamp returns a copy of events with causation and correlation filled in.
func (i *Instance[S]) stamp(events []eventstore.EventData) []eventstore.EventData {
	out := make([]eventstore.EventData, len(events))
	corr := i.event.Metadata.CorrelationID
	if corr == "" {
		corr = i.event.ID.String()
	}
	for k, e := range events {
		if e.Metadata.CausationID == "" {
			e.Metadata.CausationID = i.event.ID.String()
		}
		if e.Metadata.CorrelationID == "" {
			e.Metadata.CorrelationID = corr
		}
		out[k] = e
	}
	return out
}
