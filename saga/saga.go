package saga

import (
	"context"
	"log/slog"
	"reflect"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/scheduler"
)

// Saga coordinates a long-running process: it reacts to events, keeps a
// typed state per instance and emits effects (events, timers). S is the
// state's type; it is stored as JSON (encoding/json), so its fields must be
// exported or carry json tags.
type Saga[S any] interface {
	// Name identifies the saga: its instances' rows, and its subscriber
	// (checkpoint, lock, dead letters). It must not change between releases.
	Name() string
	// Correlate routes an event to an instance: ok false ignores the event;
	// ok true with an empty id is a permanent error (the event is
	// dead-lettered). It must be a pure function of the event.
	Correlate(e eventstore.Event) (id string, ok bool)
	// Handle applies e to the instance: it reads and changes inst.State and
	// calls inst's effect methods. Returning nil commits the new state and
	// the effects together with the checkpoint; an error discards them all
	// and the event is retried (or dead-lettered) by the runner's policy.
	Handle(ctx context.Context, inst *Instance[S], e eventstore.Event) error
}

// DefaultBatchSize is a saga's default projection.Options.BatchSize. The
// batch transaction also commits right after each event whose handler
// appended an effect (the append holds the log's ordering lock until then),
// so only events that append nothing share a transaction.
const DefaultBatchSize = 100

// DefaultPruneInterval is the default Config.PruneInterval.
const DefaultPruneInterval = time.Minute

// schedulerService is the name under which Register adds the scheduler's
// dispatcher to the runner.
const schedulerService = "annals.scheduler"

// Config configures a registered saga. Store is required.
type Config struct {
	// Store is the event store effects are appended with; the saga's table
	// lives in its schema. Required.
	Store *eventstore.Store
	// Scheduler stores the timers of Instance.Schedule and cancels an
	// instance's pending timers when it completes. Register adds its
	// dispatcher to the runner (as service "annals.scheduler"), so it runs in
	// every runner process. Defaults to none: Schedule and Cancel then fail
	// with ErrNoScheduler.
	Scheduler *scheduler.Scheduler
	// Clock is the time of Instance.Now, of the instances' timestamps and
	// of retention. Use the scheduler's clock. Defaults to the wall clock.
	Clock projection.Clock
	// Retention is how long a completed instance is kept; older ones are
	// deleted by the saga's leader while it processes events, at most once
	// per PruneInterval. An event that correlates to a deleted instance
	// starts a new one. Defaults to 0: completed instances are kept forever.
	Retention time.Duration
	// PruneInterval is the least time between two prunes. Defaults to
	// DefaultPruneInterval.
	PruneInterval time.Duration
	// Options configures the saga's subscriber as for a projection (event
	// types, retry policy, dead-letter policy, handler timeout). Partitions
	// must be 0 or 1. BatchSize defaults to DefaultBatchSize; Types defaults
	// to the handled types of a typed saga (New/On), else all types.
	Options *projection.Options
	// Logger receives prunes. Defaults to warnings and errors on
	// slog.Default() (information and debug records dropped).
	Logger *slog.Logger
}

// Errors.
var (
	// ErrConflict is returned when an instance's stored version is not the
	// one its handler started from: something else wrote the row. The batch
	// rolls back and is retried, which reloads the state.
	ErrConflict = errors.New("saga: instance state changed concurrently")
	// ErrNoScheduler is returned by Instance.Schedule and Cancel when the
	// saga was registered without a Config.Scheduler.
	ErrNoScheduler = errors.New("saga: no scheduler configured")
	// ErrNotFound is returned by Lookup for an instance that does not exist.
	ErrNotFound = errors.New("saga: instance not found")
)

// Register adds s to runner as a transactional subscriber: each event is
// correlated, its instance loaded, Handle called, and the new state, the
// effects and the checkpoint committed in the runner's batch transaction.
// Sagas get the runner's leader election, retries and dead letters.
//
// It fails, changing nothing, for a nil runner, saga, config or store, an
// empty name, Options.Partitions > 1 (the events of one instance may come
// from several streams, and partitions split the log by stream, so two
// partitions could handle one instance at once and out of order), any
// error of projection.Runner.Register (a name registered already is
// projection.ErrRegisteredTwice, naming the saga as a saga and the kind
// registered first), and a Config.Scheduler the runner
// cannot take (it has a different service named "annals.scheduler", e.g.
// another saga's scheduler: give the sagas of one runner one scheduler).
// The scheduler is added to the runner only once the saga is registered.
func Register[S any](runner *projection.Runner, s Saga[S], cfg *Config) error {
	if runner == nil {
		return errors.New("saga: Register with a nil runner")
	}
	if v := reflect.ValueOf(s); s == nil || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return errors.Newf("saga: Register(%T(nil))", s)
	}
	name := s.Name()
	if name == "" {
		return errors.Newf("saga: %T has an empty name", s)
	}
	if cfg == nil || cfg.Store == nil {
		return errors.Newf("saga %q: Config.Store is required", name)
	}
	if e, ok := s.(interface{ Err() error }); ok && e.Err() != nil {
		return e.Err()
	}
	var opts projection.Options
	if cfg.Options != nil {
		opts = *cfg.Options
	}
	if opts.Partitions > 1 {
		return errors.Newf("saga %q: %d partitions; a saga cannot be partitioned: one instance's events may come "+
			"from several streams, and partitions split the log by stream, so two partitions would handle one instance "+
			"concurrently and out of order", name, opts.Partitions)
	}
	if cfg.Retention < 0 || cfg.PruneInterval < 0 {
		return errors.Newf("saga %q: negative Retention or PruneInterval", name)
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if len(opts.Types) == 0 {
		if tl, ok := s.(projection.TypeLister); ok {
			opts.Types = tl.EventTypes()
			if len(opts.Types) == 0 {
				return errors.Newf("saga %q handles no event types", name)
			}
		}
	}
	rt, err := newRuntime(name, cfg)
	if err != nil {
		return err
	}
	// The scheduler's dispatcher is checked first and added last, after
	// Register (which rejects bad options: type globs, a duplicate name, …):
	// a rejected saga changes nothing, and a runner cannot remove a service.
	if cfg.Scheduler != nil {
		if err := runner.CanAddService(schedulerService, cfg.Scheduler); err != nil {
			return errors.Wrapf(err, "saga %q: its scheduler", name)
		}
	}
	if err := runner.Register(&adapter[S]{saga: s, rt: rt}, &opts); err != nil {
		if errors.Is(err, projection.ErrRegisteredTwice) {
			return err // it names the saga already: `projection: saga "x" is registered twice`
		}
		// The runner's other errors speak of a projection: say which saga.
		return errors.Wrapf(err, "saga %q", name)
	}
	if cfg.Scheduler != nil {
		if err := runner.AddService(schedulerService, cfg.Scheduler); err != nil {
			return errors.Wrapf(err, "saga %q is registered, but its scheduler could not be added", name)
		}
	}
	return nil
}
