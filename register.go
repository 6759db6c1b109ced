package annals

import (
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

// The Add… functions register handlers with a Client before Start; each
// kind of handler has its own, typed by what it registers, so that a
// mistake in kind is a compile error. They fail (registering nothing) for
// a nil client, a duplicate or empty name, invalid options, the mistakes
// of typed handlers (an unregistered event type), and once the client is
// running.

// AddProjection registers a projection: its read-model writes and its
// checkpoint commit in one transaction (exactly once). A typed projection
// (projection.New, projection.On) reads only its handled types; its OnSetup
// runs before it first runs. opts may be nil.
func AddProjection(c *Client, p projection.Projection, opts *projection.Options) error {
	if c == nil {
		return errNilClient("AddProjection")
	}
	if p == nil {
		return errors.New("annals: AddProjection with a nil projection")
	}
	return c.registering("AddProjection", func() error { return c.runner.Register(p, opts) })
}

// AddObserver registers an observer: side effects outside the database,
// at least once (make them idempotent with the event ID). opts may be nil.
func AddObserver(c *Client, o projection.Observer, opts *projection.Options) error {
	if c == nil {
		return errNilClient("AddObserver")
	}
	if o == nil {
		return errors.New("annals: AddObserver with a nil observer")
	}
	return c.registering("AddObserver", func() error { return c.runner.Register(o, opts) })
}

// SagaOptions configures a saga registered with AddSaga. A nil
// *SagaOptions means defaults.
type SagaOptions struct {
	// Retention is how long a completed instance is kept. Defaults to 0:
	// forever (see saga.Config.Retention).
	Retention time.Duration
	// PruneInterval is the least time between two prunes. Defaults to
	// saga.DefaultPruneInterval.
	PruneInterval time.Duration
	// Options configures the saga's subscriber as for a projection.
	// Defaults to saga's defaults.
	Options *projection.Options
}

// AddSaga registers a saga with the client's store, scheduler (its timers
// and deadlines), clock and logger: state, effects, timers and checkpoint
// commit together, exactly once.
func AddSaga[S any](c *Client, s saga.Saga[S], opts *SagaOptions) error {
	if c == nil {
		return errNilClient("AddSaga")
	}
	var o SagaOptions
	if opts != nil {
		o = *opts
	}
	cfg := &saga.Config{
		Store: c.store, Scheduler: c.sched, Logger: c.cfg.Logger,
		Retention: o.Retention, PruneInterval: o.PruneInterval, Options: o.Options,
	}
	if c.cfg.Clock != nil {
		cfg.Clock = c.cfg.Clock
	}
	return c.registering("AddSaga", func() error { return saga.Register(c.runner, s, cfg) })
}

// AddTask registers a cron task: Start stores its definition (as
// scheduler.AddTask does, which every process may do) and the dispatcher
// appends its event at every tick, exactly once cluster-wide. The task is
// checked here (scheduler.Task.Check: name, stream ID, cron expression,
// time zone, missed-tick policy; the error matches
// scheduler.ErrInvalidTask) and registers nothing when it is refused; a
// second task of the same name here is an error.
func AddTask(c *Client, t scheduler.Task) error {
	if c == nil {
		return errNilClient("AddTask")
	}
	if err := t.Check(); err != nil {
		return errors.Wrap(err, "annals: AddTask")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run != nil {
		return errors.Newf("annals: AddTask(%q) while the client is running; use Scheduler().AddTask", t.Name)
	}
	for _, have := range c.tasks {
		if have.Name == t.Name {
			return errors.Newf("annals: task %q is added twice", t.Name)
		}
	}
	c.tasks = append(c.tasks, t)
	return nil
}

// AddService registers background work that runs beside the subscribers in
// every process, for as long as the client runs (see
// projection.Runner.AddService).
func AddService(c *Client, name string, s projection.Service) error {
	if c == nil {
		return errNilClient("AddService")
	}
	return c.registering("AddService", func() error { return c.runner.AddService(name, s) })
}

// registering runs register unless the client is running (from the moment
// Start begins): the runner takes its registrations when it starts, so one
// added later would run or not by timing. c.mu is held throughout, so Start
// cannot begin in between.
func (c *Client) registering(what string, register func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run != nil {
		return errors.Newf("annals: %s while the client is running: register before Start", what)
	}
	return register()
}

// NewRepository returns the repository of an aggregate type on the
// client's store (see aggregate.NewRepository). cfg may be nil; a nil c is
// an error.
func NewRepository[A aggregate.Root](c *Client, aggregateType string, newAgg func() A, cfg *aggregate.Config) (*aggregate.Repository[A], error) {
	if c == nil {
		return nil, errNilClient("NewRepository")
	}
	return aggregate.NewRepository(c.store, aggregateType, newAgg, cfg)
}

// errNilClient is what the functions of this file return for a nil
// *Client, before anything else is looked at.
func errNilClient(what string) error {
	return errors.WithStackDepth(errors.Newf("annals: %s with a nil *Client", what), 1)
}
