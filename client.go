package annals

import (
	"context"
	"iter"
	"log/slog"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/telemetry"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/scheduler"
)

// Clock is the time source of a Client's runner (retry delays), scheduler
// (when timers and cron ticks are due) and sagas (Instance.Now). It is
// projection.Clock and scheduler.Clock; tests inject a fake one.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// After returns a channel that receives once d has passed on this clock.
	After(d time.Duration) <-chan time.Time
}

// Config configures a Client. A nil *Config means defaults. The fields at
// the top are shared by every part (store, runner, scheduler, sagas) and
// override the same settings in the per-part configs at the bottom, but for
// Schema, which the parts must agree on (see Schema).
type Config struct {
	// Registry names the Go event types, for appends, reads and typed
	// handlers. Defaults to Store.Registry, else a new, empty registry
	// (Client.Registry).
	Registry *eventstore.Registry
	// Schema is the PostgreSQL schema of the annals tables, for every part.
	// Defaults to the Schema set in Store, Runner or Scheduler, else
	// "annals". A part whose own Schema is set to another one (or that
	// disagrees with another part when this is empty) is refused by New:
	// the parts must share their tables.
	Schema string
	// Logger receives the runner's, the scheduler's and the sagas' logs
	// (leadership, retries, reconnects, read-model setups, dead letters).
	// Defaults to Runner.Logger and Scheduler.Logger, else warnings and
	// errors on slog.Default(), looked up at each record (information and
	// debug records dropped); slog.New(slog.DiscardHandler) silences it.
	Logger *slog.Logger
	// Clock decides retry delays, timers, cron ticks and sagas' Now.
	// Defaults to the wall clock.
	Clock Clock
	// TracerProvider receives the spans of appends and handlers. Defaults
	// to the global provider.
	TracerProvider trace.TracerProvider
	// MeterProvider receives append and subscriber metrics. Defaults to the
	// global provider.
	MeterProvider metric.MeterProvider
	// Retry is the retry policy of every subscriber that sets none of its
	// own. Defaults to projection's (3 retries, 1 s ×2 up to 60 s).
	Retry *projection.RetryPolicy
	// SkipMigrations makes Start, Run and RunUntilCaughtUp leave the schema
	// alone (a deploy step migrates, or the service's role may not). By
	// default they run migrations.Up first, which is idempotent and safe
	// from many processes at once, and does nothing, for any role granted
	// by annals grant, once the schema's owner has migrated; a role that
	// may not apply pending migrations gets migrations.ErrNotOwner.
	SkipMigrations bool

	// Inline lists projections applied in the transaction of each append
	// that carries one of their event types, so that their read model is
	// never behind the writer (eventstore.Config.Inline; a typed
	// projection.Projection fits as is). Start, Run and RunUntilCaughtUp set
	// up their read models (projection.Setupper, e.g. OnSetup) as they do
	// the runner's. Do not also register them with AddProjection: the runner
	// would apply every event a second time. To rebuild one from the log,
	// register it with a projection.Runner that is not run and call its
	// Rebuild while appends of its event types are paused
	// (docs/architecture.md, "Inline projections").
	// Added to Store.Inline.
	Inline []eventstore.InlineProjection
	// RunnerPool, when set, is the pool of everything that holds a session
	// (advisory locks, LISTEN) or changes the schema: the runner (its
	// batches, lock sessions and listener), the scheduler's dispatcher
	// (its appends and its LISTEN), Await, migrations and read-model
	// setups, and the scheduler's own calls (Scheduler().Schedule and the
	// rest) and personal data's keys (the registry's keyring). The pool
	// given to New serves the appends and reads of the Client and its
	// Store. Size it for Await's checkpoint reads beside the runner's
	// batches.
	// Give it a direct connection (or a pooler in session mode) when the
	// pool given to New goes through a pooler in transaction mode
	// (docs/operations.md, "PgBouncer and other poolers"): session locks
	// and LISTEN do not work through one. Defaults to the pool given to
	// New.
	RunnerPool *pgxpool.Pool

	// Store configures the event store further (page size, event size
	// limit, group commit). Its Schema, when set, is the client's schema
	// unless Schema says otherwise (see Schema). Defaults to eventstore's
	// defaults.
	Store *eventstore.Config
	// Runner configures the runner further (instance ID, intervals,
	// shutdown timeout, hooks). Its Schema is as Store's. Defaults to
	// projection's defaults.
	Runner *projection.Config
	// Scheduler configures the timer and cron dispatcher further. Its
	// Schema is as Store's. Defaults to scheduler's defaults.
	Scheduler *scheduler.Config
}

// Client is annals in one value: the event registry, the store, the runner
// of projections, observers and sagas, and the scheduler of timers and cron
// tasks, sharing one pool, schema, clock, logger and telemetry. Register
// handlers with the Add… functions of this package, then Start (or Run).
// The parts stay reachable (Store, Runner, Scheduler) and usable on their
// own. A Client is safe for concurrent use.
type Client struct {
	pool *pgxpool.Pool
	// runnerPool is Config.RunnerPool, else pool: the runner's, the
	// scheduler's, migrations' and read-model setups'.
	runnerPool *pgxpool.Pool
	cfg        Config
	store      *eventstore.Store
	runner     *projection.Runner
	sched      *scheduler.Scheduler
	// inline is the store's inline projections (Config.Store.Inline and
	// Config.Inline): their read models are set up with the runner's.
	inline []eventstore.InlineProjection

	mu    sync.Mutex
	tasks []scheduler.Task
	run   *running // nil unless started
}

// running is one Start…Stop of a Client.
type running struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the runner's run ended (or it never started)
	err    error         // why it did not start; read after done
}

// New returns a Client on pool. It does not touch the database: Start (or
// Run) migrates the schema, sets up read models and starts the runner.
// It fails for a nil pool and for invalid settings of the parts.
func New(pool *pgxpool.Pool, cfg *Config) (*Client, error) {
	if pool == nil {
		return nil, errors.New("annals: pool is nil")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	schema, err := c.schema()
	if err != nil {
		return nil, err
	}
	c.Schema = schema
	if c.Registry == nil && c.Store != nil {
		c.Registry = c.Store.Registry
	}
	if c.Registry == nil {
		c.Registry = eventstore.NewRegistry()
	}
	// A part's own logger stays unless Config.Logger is set.
	logger := c.Logger
	if c.Logger == nil {
		c.Logger = telemetry.DefaultLogger()
	}
	var sc eventstore.Config
	if c.Store != nil {
		sc = *c.Store
	}
	sc.Schema, sc.Registry = c.Schema, c.Registry
	sc.Inline = append(append([]eventstore.InlineProjection(nil), sc.Inline...), c.Inline...)
	if c.TracerProvider != nil {
		sc.TracerProvider = c.TracerProvider
	}
	if c.MeterProvider != nil {
		sc.MeterProvider = c.MeterProvider
	}
	store, err := eventstore.New(pool, &sc)
	if err != nil {
		return nil, err
	}
	c.Schema = store.Schema()

	var rc projection.Config
	if c.Runner != nil {
		rc = *c.Runner
	}
	rc.Schema, rc.Registry = c.Schema, c.Registry
	if logger != nil {
		rc.Logger = logger
	}
	if c.Clock != nil {
		rc.Clock = c.Clock
	}
	if c.Retry != nil {
		rc.Retry = c.Retry
	}
	if c.TracerProvider != nil {
		rc.TracerProvider = c.TracerProvider
	}
	if c.MeterProvider != nil {
		rc.MeterProvider = c.MeterProvider
	}
	runnerPool, schedStore := pool, store
	if c.RunnerPool != nil {
		runnerPool = c.RunnerPool
		if schedStore, err = eventstore.New(runnerPool, &sc); err != nil {
			return nil, err
		}
	}
	runner, err := projection.NewRunner(runnerPool, &rc)
	if err != nil {
		return nil, err
	}

	var dc scheduler.Config
	if c.Scheduler != nil {
		dc = *c.Scheduler
	}
	dc.Schema = c.Schema
	if logger != nil {
		dc.Logger = logger
	}
	if c.Clock != nil {
		dc.Clock = c.Clock
	}
	sched, err := scheduler.New(schedStore, &dc)
	if err != nil {
		return nil, err
	}
	// Every process of the service runs a dispatcher, so that timers (from
	// sagas or Scheduler().Schedule) and cron tasks fire wherever it runs.
	if err := runner.AddService(schedulerService, sched); err != nil {
		return nil, err
	}
	return &Client{pool: pool, runnerPool: runnerPool, cfg: c, store: store, runner: runner, sched: sched, inline: sc.Inline}, nil
}

// schema returns the schema the parts share: Schema when set, else the one
// the per-part configs that set one agree on ("" for the default). A part
// that names another schema is an error.
func (c *Config) schema() (string, error) {
	type part struct{ field, schema string }
	var parts []part
	if c.Store != nil && c.Store.Schema != "" {
		parts = append(parts, part{"Store.Schema", c.Store.Schema})
	}
	if c.Runner != nil && c.Runner.Schema != "" {
		parts = append(parts, part{"Runner.Schema", c.Runner.Schema})
	}
	if c.Scheduler != nil && c.Scheduler.Schema != "" {
		parts = append(parts, part{"Scheduler.Schema", c.Scheduler.Schema})
	}
	schema, from := c.Schema, "Schema"
	for _, p := range parts {
		if schema == "" {
			schema, from = p.schema, p.field
			continue
		}
		if p.schema != schema {
			return "", errors.Newf("annals: Config.%s is %q but Config.%s is %q: the parts of a client share one schema "+
				"(set Config.Schema alone)", p.field, p.schema, from, schema)
		}
	}
	return schema, nil
}

// schedulerService is the runner service name of the scheduler's
// dispatcher; package saga adds the same scheduler under its own name,
// which the runner recognizes as the same service.
const schedulerService = "annals.scheduler"

// Pool returns the client's pool.
func (c *Client) Pool() *pgxpool.Pool { return c.pool }

// Registry returns the event registry: register event types on it.
func (c *Client) Registry() *eventstore.Registry { return c.cfg.Registry }

// Schema returns the annals schema the client works in.
func (c *Client) Schema() string { return c.cfg.Schema }

// Store returns the event store.
func (c *Client) Store() *eventstore.Store { return c.store }

// Runner returns the runner of the registered projections, observers and
// sagas (for Rebuild, Registered, package projectioncmd).
func (c *Client) Runner() *projection.Runner { return c.runner }

// Scheduler returns the scheduler of timers and cron tasks.
func (c *Client) Scheduler() *scheduler.Scheduler { return c.sched }

// Logger returns the client's logger.
func (c *Client) Logger() *slog.Logger { return c.cfg.Logger }

// Append appends events to a stream if its version matches expected; see
// eventstore.Store.Append.
func (c *Client) Append(ctx context.Context, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	return c.store.Append(ctx, streamID, expected, events...)
}

// AppendTx appends inside tx, as the last statement before its commit; see
// eventstore.Store.AppendTx.
func (c *Client) AppendTx(ctx context.Context, tx pgx.Tx, streamID string, expected eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	return c.store.AppendTx(ctx, tx, streamID, expected, events...)
}

// Transact runs fn in a transaction and appends what it added to the batch
// last, in the same round trip as the commit; see eventstore.Store.Transact.
func (c *Client) Transact(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error) ([]eventstore.AppendResult, error) {
	return c.store.Transact(ctx, fn)
}

// ReadStream reads a stream from a version on; see eventstore.Store.ReadStream.
func (c *Client) ReadStream(ctx context.Context, streamID string, fromVersion int64) iter.Seq2[eventstore.Event, error] {
	return c.store.ReadStream(ctx, streamID, fromVersion)
}

// ReadAll reads the log from position from on (that position included), in
// commit order; see eventstore.Store.ReadAll. To resume after the last
// event seen, pass its GlobalSequence + 1.
func (c *Client) ReadAll(ctx context.Context, from int64) iter.Seq2[eventstore.Event, error] {
	return c.store.ReadAll(ctx, from)
}

// StreamVersion returns a stream's version (0 when it does not exist).
func (c *Client) StreamVersion(ctx context.Context, streamID string) (int64, error) {
	return c.store.StreamVersion(ctx, streamID)
}

// Await returns once the registered projection, observer or saga name has
// processed every event through position (read-your-writes: pass an
// append's AppendResult.Position()), woken by the checkpoint's
// notification rather than a poll. When ctx ends first it fails with a
// *projection.BehindError that says how far behind the subscriber is (and
// why, when its partition is stopped); when the subscriber passed position
// without applying its event (a dead letter: the event failed, or was
// parked behind a failure of its stream) it fails with a
// *projection.DeadLetteredError (projection.ErrDeadLettered). The
// runner need not run in this process: whichever process leads the
// subscriber moves its checkpoint.
func (c *Client) Await(ctx context.Context, name string, position int64) error {
	return c.runner.Await(ctx, name, position)
}

// Migrate creates or upgrades the annals schema (migrations.Up) on
// Config.RunnerPool when set, else on the client's pool.
func (c *Client) Migrate(ctx context.Context) error {
	_, err := migrations.Up(ctx, c.runnerPool, &migrations.Config{Schema: c.cfg.Schema})
	return err
}

// prepare migrates (unless SkipMigrations), stores the cron tasks and sets
// up the read models: what Start, Run and RunUntilCaughtUp do first.
func (c *Client) prepare(ctx context.Context) error {
	if !c.cfg.SkipMigrations {
		if err := c.Migrate(ctx); err != nil {
			return err
		}
	}
	c.mu.Lock()
	tasks := append([]scheduler.Task(nil), c.tasks...)
	c.mu.Unlock()
	for _, t := range tasks {
		if err := c.sched.AddTask(ctx, t); err != nil {
			return err
		}
	}
	if err := c.runner.Setup(ctx); err != nil {
		return err
	}
	return c.setupInline(ctx)
}

// setupInline sets up the read model of every inline projection that has a
// setup (projection.Setupper with a version), each in a transaction of its
// own, once per version per database (projection.EnsureSetup), as the
// runner does for its projections: an append that carries their event
// types finds their tables.
func (c *Client) setupInline(ctx context.Context) error {
	for _, p := range c.inline {
		s, ok := p.(projection.Setupper)
		if !ok || s.SetupVersion() <= 0 {
			continue
		}
		err := pgx.BeginTxFunc(ctx, c.runnerPool, pgtx.ReadCommitted, func(tx pgx.Tx) error {
			ran, err := projection.EnsureSetup(ctx, tx, c.cfg.Schema, p.Name(), s, c.runner.InstanceID())
			if ran {
				c.cfg.Logger.InfoContext(ctx, "annals: inline read model set up", "projection", p.Name(), "version", s.SetupVersion())
			}
			return err
		})
		if err != nil {
			return errors.Wrap(err, "annals: inline projection setup")
		}
	}
	return nil
}

// Start migrates the schema (unless Config.SkipMigrations), stores the cron
// tasks, sets up every projection's read model, the inline ones' included
// (so that reads and inline appends work when it
// returns), and starts the runner in the background: every registered
// subscriber catches up from its checkpoint and follows the log, and the
// scheduler's dispatcher fires timers and cron ticks. ctx bounds the start
// only; Stop ends the run. Start fails if the client is running or any step
// fails (then nothing runs), the runner's start-up included
// (projection.Runner.Start): a subscriber registered with another
// partition layout than it ran with fails Start with a
// *catchup.PartitionLayoutError (catchup.ErrPartitionLayout).
func (c *Client) Start(ctx context.Context) error {
	c.mu.Lock()
	if c.run != nil {
		c.mu.Unlock()
		return errors.New("annals: Start: the client is running")
	}
	// The run's context exists from here on, so that a Stop that comes
	// while Start is still migrating or setting up (a SIGTERM during a slow
	// start) cancels the start: prepare runs until ctx ends or Stop.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &running{cancel: cancel, done: make(chan struct{})}
	c.run = r
	c.mu.Unlock()
	prepCtx, cancelPrep := context.WithCancel(ctx)
	stopPrep := context.AfterFunc(runCtx, cancelPrep)
	err := c.prepare(prepCtx)
	stopPrep()
	cancelPrep()
	if err == nil && runCtx.Err() != nil {
		err = runCtx.Err() // stopped just as prepare ended: start nothing
	}
	var done <-chan struct{}
	if err == nil {
		// The runner's start-up (the partition-layout checks, the instance's
		// registration) is part of Start: its refusal is Start's error, and
		// ctx bounds it too.
		stopStart := context.AfterFunc(ctx, cancel)
		done, err = c.runner.Start(runCtx)
		if !stopStart() {
			// ctx ended as the runner started, and cancelled it: say so (its
			// statements saw a cancellation, not ctx's own error).
			if err == nil {
				<-done
			}
			err = errors.WithSecondaryError(errors.Wrap(ctx.Err(), "annals: Start"), err)
		}
	}
	if err != nil {
		if runCtx.Err() != nil && ctx.Err() == nil && errors.Is(err, context.Canceled) {
			err = errors.WithSecondaryError(errors.Wrap(context.Canceled, "annals: Start: stopped by Stop while starting"), err)
		}
		c.mu.Lock()
		c.run = nil
		c.mu.Unlock()
		r.err = err
		cancel()
		close(r.done)
		return err
	}
	go func() {
		defer close(r.done)
		<-done
	}()
	return nil
}

// Stop shuts the runner down gracefully (the batch in hand finishes within
// the runner's ShutdownTimeout, checkpoints are flushed, locks released,
// the instance deregistered) and returns when it has, or when ctx ends
// (with ctx's error; the shutdown goes on). Stopping a client that is not running does
// nothing; a stopped client can be started again. After a Stop that
// returned ctx's error the client still counts as running (Start refuses
// it) until a later Stop returns: call Stop again, with a longer deadline,
// to wait for the shutdown to finish.
func (c *Client) Stop(ctx context.Context) error {
	c.mu.Lock()
	r := c.run
	c.mu.Unlock()
	if r == nil {
		return nil
	}
	// Whether the run had ended on its own before this Stop: then its error
	// is its own, even a cancellation from a context of the user's.
	endedEarly := false
	select {
	case <-r.done:
		endedEarly = true
	default:
	}
	r.cancel()
	select {
	case <-r.done:
	case <-ctx.Done():
		return errors.Wrap(ctx.Err(), "annals: Stop")
	}
	c.mu.Lock()
	if c.run == r {
		c.run = nil
	}
	c.mu.Unlock()
	// The run's context is cancelled only here: a run still going when
	// Stop cancelled it, that ends with the cancellation (the runner was
	// still setting up and could not stop gracefully), was stopped; it did
	// not fail.
	if !endedEarly && errors.Is(r.err, context.Canceled) {
		return nil
	}
	return r.err
}

// Run is Start, then Stop when ctx ends: it returns nil after a graceful
// shutdown, or the error that kept the client from starting or ended its
// run early.
func (c *Client) Run(ctx context.Context) error {
	if err := c.Start(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	r := c.run
	c.mu.Unlock()
	if r == nil {
		return nil // stopped by a concurrent Stop already
	}
	select {
	case <-ctx.Done():
	case <-r.done: // a concurrent Stop ended the run
	}
	return c.Stop(context.WithoutCancel(ctx))
}

// RunUntilCaughtUp migrates (unless SkipMigrations), stores the cron tasks,
// sets up the read models and runs every registered subscriber up to the
// head of the log as it is when called, then returns; timers and cron
// ticks are not fired (see Scheduler().FireDue). For tests and batch jobs.
func (c *Client) RunUntilCaughtUp(ctx context.Context) error {
	if err := c.prepare(ctx); err != nil {
		return err
	}
	return c.runner.RunUntilCaughtUp(ctx)
}

// Rebuild replays a registered projection from the start of the log into
// its cleared read model while the service keeps running; see
// projection.Runner.Rebuild.
func (c *Client) Rebuild(ctx context.Context, name string, opts *projection.RebuildOptions) error {
	return c.runner.Rebuild(ctx, name, opts)
}
