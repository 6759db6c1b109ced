package projection

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
)

//go:embed instances.sql
var instancesSQL string

//go:embed failures.sql
var failuresSQL string

// Config configures a Runner. A nil *Config means defaults.
type Config struct {
	// Schema is the annals schema. Defaults to "annals".
	Schema string
	// InstanceID names this process in the instance registry and in
	// checkpoints. Defaults to "host:pid:" and a random suffix.
	InstanceID string
	// PollInterval is how long a caught-up subscriber waits for a NOTIFY
	// before reading anyway. Defaults to 1s.
	PollInterval time.Duration
	// LockRetryInterval is how often a standby process polls the locks of
	// the partitions it stands by for (one statement on one connection, ±25%
	// jitter). Defaults to 20ms (catchup.DefaultLockRetryInterval).
	LockRetryInterval time.Duration
	// RetryBackoff is the pause before a failed event is tried again.
	// Defaults to 500ms.
	RetryBackoff time.Duration
	// HeartbeatInterval is how often the instance registry is updated.
	// Defaults to 10s.
	HeartbeatInterval time.Duration
	// InstanceExpiry is how old another instance's last heartbeat may get
	// before this runner deletes its row from the registry (a process that
	// died without deregistering), checked at every heartbeat. It must exceed
	// every instance's HeartbeatInterval; a negative value never expires
	// anyone. Defaults to 10 × HeartbeatInterval.
	InstanceExpiry time.Duration
	// ShutdownTimeout bounds the graceful shutdown: the batch in hand may run
	// this long after the context ends; then its context is cancelled, and a
	// batch still running a second later is abandoned (its transaction rolled
	// back by closing its connection). Defaults to 30s.
	ShutdownTimeout time.Duration
	// Lock configures the advisory-lock connections. Defaults to advisorylock's defaults.
	Lock *advisorylock.Config
	// ReadPool, if set, is a pool on a streaming replica of the database:
	// the subscribers' catch-up and live reads (and a rebuild's) go there,
	// while locks, checkpoints and handler transactions stay on the
	// primary. A lagging replica delays delivery and never skips (see
	// catchup.Config.ReadPool). A blue/green rebuild reads its replay there
	// up to what the replica shows, and the rest, and its cut-over's
	// catch-up, from the primary: a lagging replica neither holds its
	// cut-over back nor lets it stop short ("Blue/green read models" in
	// the package doc). Defaults to none.
	ReadPool *pgxpool.Pool
	// Logger receives leadership changes, retries, reconnects and dead
	// letters. Defaults to warnings and errors (a dead letter, a lost
	// leadership) on slog.Default(), looked up at each record; information
	// and debug records dropped. slog.New(slog.DiscardHandler) silences it.
	Logger *slog.Logger
	// Retry is the retry policy of every subscriber that sets none of its
	// own (NewRunner refuses one that RetryPolicy.Validate refuses).
	// Defaults to 3 retries, 1s initial delay, ×2, at most 60s, ±20%.
	Retry *RetryPolicy
	// Clock times retry delays. Defaults to the wall clock.
	Clock Clock
	// Hooks are called on retries and dead letters (metrics, alerts).
	// Defaults to none.
	Hooks Hooks
	// TracerProvider receives the runner's spans: one per batch
	// ("annals.batch"), and with HandlerSpans one per handler call.
	// Defaults to the global provider.
	TracerProvider trace.TracerProvider
	// MeterProvider receives the runner's metrics (see internal/telemetry's
	// doc for the list). Defaults to the global provider.
	MeterProvider metric.MeterProvider
	// Registry upcasts every event to its type's current schema version
	// (eventstore.Registry.RegisterUpcaster) before any handler sees it,
	// including retries and re-delivered dead letters; an upcaster error is
	// a failed attempt (retried, then dead-lettered). Typed handlers (On,
	// Observe) decode with eventstore.Decode[T], which upcasts with their own
	// registry even without this. Defaults to nil: untyped handlers get
	// events as stored.
	Registry *eventstore.Registry
	// HandlerSpans gives every handler call a span of its own
	// ("annals.handle <type>", linked to the span of the append that
	// produced the event) and an annals.handler.duration record. They cost
	// catch-up throughput even with no-op providers (a span, a timer and a
	// context per event), so by default telemetry is per batch: a span
	// ("annals.batch") and annals.batch.duration and
	// annals.subscription.events records per batch. Defaults to false.
	HandlerSpans bool
	// HandlerSpanParent makes a handler's span (HandlerSpans) a child of the
	// producing append's span instead of linking to it (one trace across the
	// event store). Defaults to false (a link).
	HandlerSpanParent bool
	// Wake, when set, wakes each led subscriber partition in place of NOTIFY:
	// package walsource's (*Wake).For follows a logical replication slot of
	// the partition's own. Defaults to nil: NOTIFY (catchup.Listener).
	Wake catchup.WakeFor
}

// Options configures one registered projection or observer. A nil *Options
// means defaults.
type Options struct {
	// Types are event-type glob patterns (see catchup.Filter). Defaults to
	// the handled types of a typed projection or observer, else all types.
	// For a typed one, Types that select none of its handled types are
	// refused (it would handle nothing), and Types that leave some out are
	// logged as a warning at Register (their handlers never run).
	Types []string
	// Partitions splits the subscriber by a stable hash of the partition
	// key (PartitionBy) into this many partitions, each with its own lock
	// and checkpoint, which the runners running the subscriber share fairly
	// (see package catchup, "Balanced leadership"); per-key order holds.
	// Defaults to 1. Partitions and PartitionBy are fixed at the
	// subscriber's first run: Run and RunUntilCaughtUp refuse another
	// count or key (catchup.ErrPartitionLayout), which would skip or repeat
	// events. A new layout needs a new projection name.
	Partitions int
	// PartitionBy is the partition key: "stream" (the stream ID, the
	// default), "category" (the stream ID up to its first "-"), or
	// "metadata:FIELD" (a top-level metadata field, e.g. a tenant ID). See
	// catchup.PartitionByStream and the constants next to it.
	PartitionBy string
	// BatchSize is the number of events read (and, for projections,
	// committed) at a time. Defaults to 500.
	BatchSize int
	// CheckpointEvery and CheckpointInterval batch an observer's checkpoint
	// writes: every N events or T, whichever comes first (also while idle),
	// and when it stops. Defaults to 100 and 1s. Projections ignore them: their
	// checkpoint commits with each batch.
	CheckpointEvery    int
	CheckpointInterval time.Duration
	// Retry overrides Config.Retry for this subscriber (Register refuses
	// one that RetryPolicy.Validate refuses).
	Retry *RetryPolicy
	// OnDeadLetter is what happens after an event is dead-lettered.
	// Defaults to ParkStream for projections and SkipEvent for observers.
	OnDeadLetter DeadLetterPolicy
	// HandlerTimeout bounds each Handle call through its context; a timeout
	// is a failed attempt. Defaults to 30s. A timeout of 100 years or more
	// (math.MaxInt64, say) means none: the handler's context then has no
	// deadline of its own. HandlerTimeout plus the lock's FreezeTimeout is
	// also how long the subscriber's transactions may idle between two
	// statements before the server ends them (see "A leader frozen in a
	// transaction" in the package documentation).
	HandlerTimeout time.Duration
	// SyncCommits makes every batch of a projection wait for its commit's
	// WAL flush. By default a batch read while the projection is behind the
	// head of the log (catching up, rebuilding) commits without waiting
	// for the flush (synchronous_commit off for that transaction alone);
	// the batch that reaches the head waits, flushing every one before it.
	// The read model and its checkpoint still commit together, so a crash
	// of PostgreSQL loses at most the last moments of batches and they are
	// applied again: exactly once holds. What changes is that other
	// sessions may see those read-model rows before they are durable: set
	// SyncCommits when something outside acts on the rows as they appear
	// (use an observer or a saga for that instead, where you can). A batch
	// whose transaction appended events always waits.
	//
	// An observer's checkpoint writes follow the same rule: while it is
	// behind the head they do not wait for their flush, so a crash of
	// PostgreSQL (not of the runner) during a catch-up can lose the last
	// moments of them, and the events since the last durable one are
	// delivered again (at least once, as always). SyncCommits makes an
	// observer's every write wait, so that a crash re-delivers no more than
	// CheckpointEvery events.
	SyncCommits bool
	// BlueGreen makes a projection's read model versioned, one schema per
	// generation behind stable views, for rebuilds without downtime
	// (RebuildBlueGreen, Rollback). Defaults to nil: the read model is the
	// projection's own tables, rebuilt in place (Rebuild).
	BlueGreen *BlueGreen
	// Kind is what kind of subscriber RegisterProcessor adds (package
	// relay's says "relay"), as ErrRegisteredTwice's message names it and
	// the runner records it for the subscriber's name (see
	// SubscriberKindError). Defaults to "processor". Register ignores it:
	// a handler's kind is "projection", "observer", or what its method
	// SubscriberKind() string returns.
	Kind string
}

type registration struct {
	name    string
	kind    string // "projection", "observer" or "processor" (RegisterProcessor)
	opts    Options
	filter  catchup.Filter
	newProc func() catchup.Processor
	bg      *blueGreenReg // nil unless Options.BlueGreen
}

// Runner runs registered projections and observers: it elects one leader
// per subscriber partition across every process, catches up from the
// checkpoint and follows the log live.
type Runner struct {
	pool   *pgxpool.Pool
	cfg    Config
	engine *catchup.Engine
	q      map[string]string
	fq     map[string]string // failures.sql

	mu       sync.Mutex
	regs     []*registration
	names    map[string]bool
	services []namedService
	running  bool
	leading  map[leadKey]int64 // -> epoch
	progress map[leadKey]progress
	changed  chan struct{}
	hostname string
	tel      *telemetry.Subscription
	awaiter  *Awaiter // Runner.Await's, made on first use
}

// progress is the last known position of a led partition, for lag metrics.
type progress struct {
	cursor, head int64
	oldest       time.Time
}

type leadKey struct {
	sub  string
	part int
}

// NewRunner returns a Runner on pool. It fails for a Config.Retry that
// RetryPolicy.Validate refuses (ErrInvalidRetryPolicy).
func NewRunner(pool *pgxpool.Pool, cfg *Config) (*Runner, error) {
	if pool == nil {
		return nil, errors.New("projection: pool is nil")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	var err error
	if c.Schema, err = schemaname.Resolve(c.Schema); err != nil {
		return nil, err
	}
	if c.Retry != nil {
		if err := c.Retry.Validate(); err != nil {
			return nil, errors.Wrap(err, "projection: Config.Retry")
		}
	}
	host, _ := os.Hostname()
	if c.InstanceID == "" {
		c.InstanceID = catchup.DefaultOwner() + ":" + uuid.NewString()[:8]
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 10 * time.Second
	}
	if c.InstanceExpiry == 0 {
		c.InstanceExpiry = 10 * c.HeartbeatInterval
	}
	if c.Logger == nil {
		c.Logger = telemetry.DefaultLogger()
	}
	tel, err := telemetry.NewSubscription(c.TracerProvider, c.MeterProvider)
	if err != nil {
		return nil, err
	}
	r := &Runner{pool: pool, cfg: c, names: map[string]bool{}, leading: map[leadKey]int64{},
		progress: map[leadKey]progress{}, changed: make(chan struct{}, 1), hostname: host, tel: tel}
	q, err := sqltmpl.Named("instances.sql", instancesSQL, sqltmpl.NewData(c.Schema))
	if err != nil {
		return nil, err
	}
	r.q = q
	kq, err := sqltmpl.Named("kinds.sql", kindsSQL, sqltmpl.NewData(c.Schema))
	if err != nil {
		return nil, err
	}
	for name, sql := range kq {
		r.q[name] = sql
	}
	if r.fq, err = sqltmpl.Named("failures.sql", failuresSQL, sqltmpl.NewData(c.Schema)); err != nil {
		return nil, err
	}
	if c.Clock == nil {
		r.cfg.Clock = realClock{}
	}
	return r, nil
}

// InstanceID returns the instance's ID.
func (r *Runner) InstanceID() string { return r.cfg.InstanceID }

// Register adds a Projection or an Observer. It fails for an empty or
// duplicate name, a name reserved for blue/green generations (ending in #g
// and digits, like their subscribers <name>#g<N>), a handler that is
// neither (or both), invalid options or glob patterns, Options.Types that
// select none of a typed handler's event types, and mistakes in typed
// handlers. A duplicate name is [ErrRegisteredTwice], whose message names
// the kind of each registration: "projection" or "observer", or what a
// handler that has a method SubscriberKind() string returns (a saga's
// says "saga").
func (r *Runner) Register(handler any, opts *Options) error {
	var o Options
	if opts != nil {
		o = *opts
	}
	var name, kind string
	var newProc func() catchup.Processor
	p, isProj := handler.(Projection)
	obs, isObs := handler.(Observer)
	if v := reflect.ValueOf(handler); handler == nil || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return errors.Newf("projection: Register(%T(nil))", handler)
	}
	switch {
	case isProj && isObs:
		return errors.Newf("projection: %T is both a Projection and an Observer", handler)
	case isProj:
		name, kind = p.Name(), "projection"
		if o.OnDeadLetter == DefaultPolicy {
			o.OnDeadLetter = ParkStream
		}
		cut, _ := p.(CommitCutter)
		newProc = func() catchup.Processor { return &txProcessor{p: p, f: r.failures(name, o), cut: cut} }
	case isObs:
		name, kind = obs.Name(), "observer"
		every, interval := o.CheckpointEvery, o.CheckpointInterval
		if every <= 0 {
			every = 100
		}
		if interval <= 0 {
			interval = time.Second
		}
		if o.OnDeadLetter == DefaultPolicy {
			o.OnDeadLetter = SkipEvent
		}
		newProc = func() catchup.Processor {
			return &observerProcessor{o: obs, f: r.failures(name, o), every: every, interval: interval}
		}
	default:
		return errors.Newf("projection: %T is neither a Projection nor an Observer", handler)
	}
	if k, ok := handler.(interface{ SubscriberKind() string }); ok && k.SubscriberKind() != "" {
		kind = k.SubscriberKind()
	}
	if name == "" {
		return errors.Newf("projection: %T has an empty name", handler)
	}
	if err := checkName(name); err != nil {
		return err
	}
	if e, ok := handler.(interface{ Err() error }); ok && e.Err() != nil {
		return e.Err()
	}
	if err := nonNegative(fmt.Sprintf("projection: %q", name), opt("Options.Partitions", o.Partitions),
		opt("Options.BatchSize", o.BatchSize), opt("Options.CheckpointEvery", o.CheckpointEvery),
		opt("Options.CheckpointInterval", o.CheckpointInterval), opt("Options.HandlerTimeout", o.HandlerTimeout)); err != nil {
		return err
	}
	if o.OnDeadLetter < DefaultPolicy || o.OnDeadLetter > Stop {
		return errors.Newf("projection: %q: unknown dead-letter policy %d", name, o.OnDeadLetter)
	}
	if o.Retry != nil {
		if err := o.Retry.Validate(); err != nil {
			return errors.Wrapf(err, "projection: %q: Options.Retry", name)
		}
	}
	if o.Partitions == 0 {
		o.Partitions = 1
	}
	if o.Partitions > 1024 {
		return errors.Newf("projection: %q: %d partitions; at most 1024", name, o.Partitions)
	}
	types := o.Types
	tl, lists := handler.(TypeLister)
	if len(types) == 0 && lists {
		if types = tl.EventTypes(); len(types) == 0 {
			return errors.Newf("projection: %q handles no event types", name)
		}
	}
	filter, err := catchup.ParseFilter(types)
	if err != nil {
		return errors.Wrapf(err, "projection: %q", name)
	}
	if len(o.Types) > 0 && lists {
		if err := r.checkTypes(name, filter, tl.EventTypes()); err != nil {
			return err
		}
	}
	if err := catchup.ParsePartitionBy(o.PartitionBy); err != nil {
		return errors.Wrapf(err, "projection: %q", name)
	}
	var bg *blueGreenReg
	if o.BlueGreen != nil {
		if bg, err = newBlueGreenReg(name, handler, o.BlueGreen); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		return errors.New("projection: Register after Run started")
	}
	if err := r.registeredTwice(kind, name); err != nil {
		return err
	}
	r.names[name] = true
	r.regs = append(r.regs, &registration{name: name, kind: kind, opts: o, filter: filter, newProc: newProc, bg: bg})
	if bg != nil && !slices.ContainsFunc(r.services, func(ns namedService) bool { return ns.name == blueGreenServiceName }) {
		r.services = append(r.services, namedService{blueGreenServiceName, &blueGreenService{r: r}})
	}
	return nil
}

// ErrRegisteredTwice is returned by [Runner.Register] and
// [Runner.RegisterProcessor] for a name already registered. The error's
// message names the kind of both registrations when they differ:
// `projection: observer "w" is registered twice (first as a saga)`.
var ErrRegisteredTwice = errors.New("projection: a subscriber of that name is registered already")

// registeredTwice refuses a registration of kind under a name already
// registered, naming both kinds when they differ: "projection: observer
// "w" is registered twice (first as a projection)". A handler's kind is
// its SubscriberKind when it has one (a saga's). r.mu is held.
func (r *Runner) registeredTwice(kind, name string) error {
	if !r.names[name] {
		return nil
	}
	for _, reg := range r.regs {
		if reg.name == name && reg.kind != kind {
			article := "a"
			if strings.ContainsAny(reg.kind[:1], "aeiou") {
				article = "an"
			}
			return errmark.Mark(errors.Newf("projection: %s %q is registered twice (first as %s %s)", kind, name, article, reg.kind),
				ErrRegisteredTwice)
		}
	}
	return errmark.Mark(errors.Newf("projection: %s %q is registered twice", kind, name), ErrRegisteredTwice)
}

// option is a numeric option that must not be negative: its name as the
// caller writes it (Options.Partitions) and its value.
type option struct {
	name     string
	value    any
	negative bool
}

func opt[T int | time.Duration](name string, v T) option { return option{name, v, v < 0} }

// nonNegative refuses the first negative option, naming it and its value:
// "<what>: Options.Partitions is -1: must be 0 or more".
func nonNegative(what string, opts ...option) error {
	for _, o := range opts {
		if o.negative {
			return errors.Newf("%s: %s is %v: must be 0 or more", what, o.name, o.value)
		}
	}
	return nil
}

// checkTypes compares Options.Types (filter) with the event types a typed
// handler handles: a filter that selects none of them delivers the handler
// nothing, which is refused; one that leaves some out is allowed (the
// subscriber may be split on purpose) and logged as a warning.
func (r *Runner) checkTypes(name string, filter catchup.Filter, handled []string) error {
	var left []string
	for _, t := range handled {
		if !filter.Match(t) {
			left = append(left, t)
		}
	}
	switch {
	case len(handled) == 0 || len(left) == 0:
		return nil
	case len(left) == len(handled):
		return errors.Newf("projection: %q: Options.Types %q select none of the event types it handles (%s): it would handle nothing",
			name, filter.Patterns(), strings.Join(handled, ", "))
	}
	sort.Strings(left)
	r.cfg.Logger.Warn("annals: Options.Types leave out event types the handler handles; their handlers never run",
		slog.String("subscriber", name), slog.Any("types", filter.Patterns()), slog.String("not_selected", strings.Join(left, ", ")))
	return nil
}

// Service is background work that runs beside the subscribers for as long
// as Run does, in every runner process: the scheduler's dispatcher is one.
// Run should return when ctx ends; an error returned before that is logged
// and Run is called again after RetryBackoff.
type Service interface {
	Run(ctx context.Context) error
}

type namedService struct {
	name string
	svc  Service
}

// AddService adds background work that Run runs beside the subscribers and
// waits for at shutdown. Adding a service that is already added (under any
// name) is a no-op, so that libraries (package saga) and the application can
// both add the scheduler without running two dispatchers; another service
// under a used name is an error.
func (r *Runner) AddService(name string, s Service) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	added, err := r.canAddServiceLocked(name, s)
	if err != nil || added {
		return err
	}
	r.services = append(r.services, namedService{name, s})
	return nil
}

// CanAddService reports the error AddService(name, s) would return now,
// adding nothing: for a caller that must add a service along with a
// registration and may do neither if either is refused (saga.Register).
func (r *Runner) CanAddService(name string, s Service) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err := r.canAddServiceLocked(name, s)
	return err
}

// canAddServiceLocked checks AddService(name, s) under r.mu: added reports
// that s is added already (under any name), which AddService accepts.
func (r *Runner) canAddServiceLocked(name string, s Service) (added bool, err error) {
	if name == "" {
		return false, errors.New("projection: AddService with an empty name")
	}
	if v := reflect.ValueOf(s); s == nil || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return false, errors.Newf("projection: AddService(%q, nil)", name)
	}
	if r.running {
		return false, errors.New("projection: AddService after Run started")
	}
	for _, ns := range r.services {
		if sameService(ns.svc, s) {
			return true, nil
		}
		if ns.name == name {
			return false, errors.Newf("projection: a different service is already added as %q", name)
		}
	}
	return false, nil
}

// sameService reports whether a and b are the same service value; values of
// a type that cannot be compared (a func type, a struct holding a map) are
// never the same (comparing them would panic).
func sameService(a, b Service) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
}

// runService runs s until ctx ends, restarting it after an error.
func (r *Runner) runService(ctx context.Context, ns namedService) {
	backoff := max(r.cfg.RetryBackoff, 100*time.Millisecond)
	for {
		err := safely(func() error { return ns.svc.Run(ctx) })
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("returned before shutdown")
		}
		r.cfg.Logger.ErrorContext(ctx, "annals: service failed; restarting", slog.String("service", ns.name), telemetry.Err(err))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// failures returns the failure handling of one subscriber.
func (r *Runner) failures(name string, o Options) *failures {
	policy := RetryPolicy{}
	if r.cfg.Retry != nil {
		policy = *r.cfg.Retry
	}
	if o.Retry != nil {
		policy = *o.Retry
	}
	timeout := o.HandlerTimeout
	switch {
	case timeout <= 0:
		timeout = 30 * time.Second
	case timeout >= unboundedTimeout:
		timeout = 0 // none
	}
	sub := telemetry.Subscriber.String(name)
	idle, every := idleLimit(timeout, r.cfg.Lock), time.Duration(0)
	setup := pgtx.IdleSetup(idle)
	if setup == "" {
		idle = 0 // none, or longer than the server takes
	} else {
		every = (idle - timeout) / 3 // a third of FreezeTimeout, as a lock pings its session
	}
	redelivery := idle
	if timeout > 0 && (idle == 0 || timeout+redeliverySlack < idle) {
		redelivery = timeout + redeliverySlack
	}
	return &failures{
		name: name, q: r.fq, retry: policy.withDefaults(), policy: o.OnDeadLetter,
		timeout: timeout, idle: idle, every: every, setup: setup, begin: pgtx.BeginIdle(idle), redeliveryBegin: pgtx.BeginIdle(redelivery),
		clock: r.cfg.Clock, hooks: r.cfg.Hooks, logger: r.cfg.Logger,
		tel: r.tel, childSpans: r.cfg.HandlerSpanParent, eventSpans: r.cfg.HandlerSpans, registry: r.cfg.Registry, attempts: map[uuid.UUID]int{},
		subAttrs: metric.WithAttributes(sub),
		okAttrs:  metric.WithAttributes(sub, telemetry.Outcome.String("ok")),
		errAttrs: metric.WithAttributes(sub, telemetry.Outcome.String("error")),
	}
}

func (r *Runner) newEngine(listener *catchup.Listener) (*catchup.Engine, error) {
	return catchup.NewEngine(r.pool, listener, &catchup.Config{
		Schema:            r.cfg.Schema,
		Owner:             r.cfg.InstanceID,
		PollInterval:      r.cfg.PollInterval,
		LockRetryInterval: r.cfg.LockRetryInterval,
		RetryBackoff:      r.cfg.RetryBackoff,
		ShutdownTimeout:   r.cfg.ShutdownTimeout,
		Lock:              r.cfg.Lock,
		ReadPool:          r.cfg.ReadPool,
		Logger:            r.cfg.Logger,
		OnLeadership:      r.onLeadership,
		OnProgress:        r.onProgress,
		WakeFor:           r.cfg.Wake,
		// A partition this runner wants, held for three heartbeats (what
		// annals status calls stale) by a session that no live instance
		// lists, is logged at WARN; a rebuild's is not.
		HolderWarnAfter: 3 * r.cfg.HeartbeatInterval,
		RebuildKey:      r.rebuildKeyOf,
	})
}

// rebuildKeyOf returns the key of the lock a rebuild holds for its whole
// run (RebuildLockKey) while it leads the partitions of subscriber: a
// projection's, or a blue/green read model's for one of its generations
// (<name>#g<N>).
func (r *Runner) rebuildKeyOf(subscriber string) string {
	name := subscriber
	if i := strings.LastIndex(name, "#g"); i > 0 && i+2 < len(name) && strings.TrimLeft(name[i+2:], "0123456789") == "" {
		name = name[:i]
	}
	return RebuildLockKey(r.cfg.Schema, name)
}

func (r *Runner) subscriptions() []*catchup.Subscription {
	r.mu.Lock()
	defer r.mu.Unlock()
	var subs []*catchup.Subscription
	for _, reg := range r.regs {
		if reg.bg != nil {
			continue // its generations run in the blue/green service
		}
		for part := range reg.opts.Partitions {
			subs = append(subs, &catchup.Subscription{
				Name: reg.name, Partition: part, Partitions: reg.opts.Partitions, PartitionBy: reg.opts.PartitionBy,
				Filter: reg.filter, BatchSize: reg.opts.BatchSize, Processor: reg.newProc(),
				Balance: true, SyncCommits: reg.opts.SyncCommits,
			})
		}
	}
	return subs
}

// Run runs every registered subscriber until ctx ends, then shuts down
// gracefully (the batch in hand finishes within ShutdownTimeout, observer
// checkpoints are flushed, locks released, the instance deregistered) and
// returns nil. It returns an error only if it cannot start (a subscriber
// run with another partition layout than before is one such case:
// catchup.ErrPartitionLayout); a start-up step that fails because ctx
// ended (Ctrl-C right after start) is no such case, and Run returns nil.
// It is Start, then a wait for its run.
func (r *Runner) Run(ctx context.Context) error {
	done, err := r.Start(ctx)
	if err != nil {
		if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			return nil
		}
		return err
	}
	<-done
	return nil
}

// Start runs Run's start-up steps — the check of each subscriber's kind
// against the kind recorded for its name (ErrSubscriberKind), the
// read-model setups (Setup), the partition-layout checks of every
// subscriber (catchup.ErrPartitionLayout) and of the blue/green
// generations, the recording of each subscriber's kind, the instance's
// registration — and
// returns the error of the first that fails, with nothing started. When
// they succeed it starts the subscribers and services in the background
// and returns at once; they run until ctx ends and then shut down
// gracefully, as in Run, and the returned channel is closed once they have.
// Unlike Client.Start's, ctx is the run's lifetime, not only the start's.
// A runner runs once at a time: Start and Run fail while it runs.
func (r *Runner) Start(ctx context.Context) (<-chan struct{}, error) {
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return nil, errors.New("projection: the runner is running already (Run or Start called twice)")
	}
	r.running = true
	r.mu.Unlock()
	stopped := func() {
		r.mu.Lock()
		r.running = false
		r.mu.Unlock()
	}
	run, err := r.start(ctx)
	if err != nil {
		stopped()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer stopped()
		run()
	}()
	return done, nil
}

// start runs the start-up steps of Start and returns the run that follows
// them: the subscribers and services until ctx ends, then the shutdown.
func (r *Runner) start(ctx context.Context) (run func(), err error) {
	subs := r.subscriptions()
	r.mu.Lock()
	services := append([]namedService(nil), r.services...)
	r.mu.Unlock()
	if len(subs) == 0 && len(services) == 0 {
		return nil, errors.New("projection: nothing registered")
	}
	// A subscriber under a name recorded as another kind's that would
	// share its checkpoint (ErrSubscriberKind): refuse before anything is
	// set up or recorded.
	if err := r.checkKinds(ctx); err != nil {
		return nil, err
	}
	if err := r.Setup(ctx); err != nil {
		return nil, err
	}
	listener, err := catchup.NewPoolListener(r.pool, r.cfg.Schema, r.cfg.Logger)
	if err != nil {
		return nil, err
	}
	engine, err := r.newEngine(listener)
	if err != nil {
		return nil, err
	}
	// A subscriber run with another partition layout than before would
	// skip or repeat events: refuse to start instead.
	for _, s := range subs {
		if err := engine.CheckLayout(ctx, s); err != nil {
			return nil, errors.Wrapf(err, "projection: %q", s.Name)
		}
	}
	if err := r.checkBlueGreenLayouts(ctx, engine); err != nil {
		return nil, err
	}
	if err := r.recordKinds(ctx); err != nil {
		return nil, err
	}
	if err := r.register(ctx); err != nil {
		return nil, err
	}
	metrics, err := r.observe(listener)
	if err != nil {
		return nil, err
	}
	return func() {
		defer func() { _ = metrics.Unregister() }()
		r.serve(ctx, listener, engine, subs, services)
	}, nil
}

// serve runs the listener, the heartbeat, the services and the subscribers
// until ctx ends, waits for them and deregisters the instance.
func (r *Runner) serve(ctx context.Context, listener *catchup.Listener, engine *catchup.Engine, subs []*catchup.Subscription, services []namedService) {
	var wg sync.WaitGroup
	listenCtx, stopListener := context.WithCancel(context.WithoutCancel(ctx))
	wg.Add(1)
	go func() { defer wg.Done(); _ = listener.Run(listenCtx) }()
	hbCtx, stopHeartbeat := context.WithCancel(context.WithoutCancel(ctx))
	hbDone := make(chan struct{})
	go func() { defer close(hbDone); r.heartbeat(hbCtx) }()

	var subWG sync.WaitGroup
	for _, ns := range services {
		subWG.Add(1)
		go func() { defer subWG.Done(); r.runService(ctx, ns) }()
	}
	for _, s := range subs {
		subWG.Add(1)
		go func() {
			defer subWG.Done()
			if err := engine.Run(ctx, s); err != nil {
				r.cfg.Logger.ErrorContext(ctx, "annals: subscription ended", slog.String("subscriber", s.Name), telemetry.Err(err))
			}
		}()
	}
	subWG.Wait()
	stopListener()
	wg.Wait()
	stopHeartbeat()
	<-hbDone
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := r.pool.Exec(dctx, r.q["Deregister"], r.cfg.InstanceID); err != nil {
		r.cfg.Logger.WarnContext(dctx, "annals: deregistering the instance failed", telemetry.Err(err))
	}
}

// RunUntilCaughtUp processes every registered subscriber up to the head of
// the log as it is when called, then returns. It waits for each subscriber
// partition's lock, so it stands by while another instance leads it. For
// tests, rebuilds and batch jobs. It checks and records the subscribers'
// kinds and layouts as Start does (ErrSubscriberKind,
// catchup.ErrPartitionLayout).
func (r *Runner) RunUntilCaughtUp(ctx context.Context) error {
	subs := r.subscriptions()
	if len(subs) == 0 && !r.hasBlueGreen() {
		return errors.New("projection: nothing registered")
	}
	if err := r.checkKinds(ctx); err != nil {
		return err
	}
	if err := r.Setup(ctx); err != nil {
		return err
	}
	engine, err := r.newEngine(nil)
	if err != nil {
		return err
	}
	// Refuse another partition layout before any subscriber catches up.
	for _, s := range subs {
		if err := engine.CheckLayout(ctx, s); err != nil {
			return errors.Wrapf(err, "projection: %q", s.Name)
		}
	}
	if err := r.checkBlueGreenLayouts(ctx, engine); err != nil {
		return err
	}
	if err := r.recordKinds(ctx); err != nil {
		return err
	}
	head, err := engine.Head(ctx)
	if err != nil {
		return err
	}
	for _, s := range subs {
		if err := r.catchUp(ctx, engine, s, head); err != nil {
			return err
		}
	}
	return r.catchUpBlueGreen(ctx, engine, head)
}

// catchUp retries a subscriber partition until it reaches head: handler
// failures are retried after RetryBackoff, as in Run.
func (r *Runner) catchUp(ctx context.Context, engine *catchup.Engine, s *catchup.Subscription, head int64) error {
	for {
		err := engine.CatchUp(ctx, s, head)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || errors.Is(err, catchup.ErrStopped) || errors.Is(err, catchup.ErrPartitionLayout) {
			return errors.Wrapf(err, "projection: %q did not catch up", s.Name)
		}
		r.cfg.Logger.WarnContext(ctx, "annals: catching up failed; retrying", slog.String("subscriber", s.Name), telemetry.Err(err))
		backoff := r.cfg.RetryBackoff
		if backoff <= 0 {
			backoff = 500 * time.Millisecond // the documented default (a database down is not retried 100 times a second)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Wrapf(err, "projection: %q did not catch up", s.Name)
		case <-t.C:
		}
	}
}

func (r *Runner) onLeadership(sub string, part int, epoch int64, leading bool) {
	r.mu.Lock()
	if leading {
		r.leading[leadKey{sub, part}] = epoch
		r.cfg.Logger.Info("annals: leadership acquired", slog.String("subscriber", sub), slog.Int("partition", part), slog.Int64("epoch", epoch))
	} else if r.leading[leadKey{sub, part}] == epoch {
		delete(r.leading, leadKey{sub, part})
		delete(r.progress, leadKey{sub, part})
		r.cfg.Logger.Info("annals: leadership released", slog.String("subscriber", sub), slog.Int("partition", part), slog.Int64("epoch", epoch))
	}
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *Runner) onProgress(sub string, part int, cursor, head int64, oldest time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, leading := r.leading[leadKey{sub, part}]; leading {
		r.progress[leadKey{sub, part}] = progress{cursor: cursor, head: head, oldest: oldest}
	}
}

// observe registers the callback of the observable instruments: lag and
// leadership per subscriber partition, listener reconnects.
func (r *Runner) observe(listener *catchup.Listener) (metric.Registration, error) {
	return r.tel.Meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		now := r.cfg.Clock.Now()
		for _, reg := range r.regs {
			for part := range reg.opts.Partitions {
				k := leadKey{reg.name, part}
				attrs := metric.WithAttributes(telemetry.Subscriber.String(reg.name), telemetry.Partition.Int(part))
				_, leading := r.leading[k]
				o.ObserveInt64(r.tel.Leader, map[bool]int64{true: 1, false: 0}[leading], attrs)
				p, known := r.progress[k]
				if !leading || !known {
					continue
				}
				o.ObserveInt64(r.tel.Lag, max(p.head-p.cursor, 0), attrs)
				age := 0.0
				if !p.oldest.IsZero() {
					age = max(now.Sub(p.oldest).Seconds(), 0)
				}
				o.ObserveFloat64(r.tel.LagTime, age, attrs)
			}
		}
		r.observeGenerations(o, now)
		o.ObserveInt64(r.tel.Reconnects, listener.Reconnects())
		return nil
	}, r.tel.Leader, r.tel.Lag, r.tel.LagTime, r.tel.Reconnects)
}

type leadEntry struct {
	Subscriber string `json:"subscriber"`
	Partition  int    `json:"partition"`
	Epoch      int64  `json:"epoch"`
}

// leadingJSON returns the leads column's value. It is a json.RawMessage, not
// a []byte: pgx sends a []byte as bytea text ("\x5b...") in the query exec
// modes that do not describe the statement first (QueryExecModeExec and
// QueryExecModeSimpleProtocol, what PgBouncer before 1.21 needs), which the
// json column refuses; a json.RawMessage it sends as JSON in every mode.
func (r *Runner) leadingJSON() json.RawMessage {
	r.mu.Lock()
	entries := make([]leadEntry, 0, len(r.leading))
	for k, e := range r.leading {
		entries = append(entries, leadEntry{k.sub, k.part, e})
	}
	r.mu.Unlock()
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].Subscriber != entries[j].Subscriber {
			return entries[i].Subscriber < entries[j].Subscriber
		}
		return entries[i].Partition < entries[j].Partition
	})
	b, _ := json.Marshal(entries)
	return b
}

func (r *Runner) register(ctx context.Context) error {
	_, err := r.pool.Exec(ctx, r.q["Register"], r.cfg.InstanceID, r.hostname, os.Getpid(), r.leadingJSON())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		// The runner's first write: a role of another kind (a writer's,
		// a reader's) or one granted by an older annals.
		return errmark.Mark(errors.Wrap(err, "projection: register the instance: the pool's role may not run projections "+
			"(a writer or reader role, or a runner granted by an older annals): run 'annals grant runner ROLE' as the schema's owner, "+
			"or give the runner a pool of a runner role (annals.Config.RunnerPool)"), eventstore.ErrNotGranted)
	}
	return errors.Wrap(err, "projection: register the instance")
}

// heartbeat updates the registry every HeartbeatInterval and at once when
// leadership changes.
func (r *Runner) heartbeat(ctx context.Context) {
	t := time.NewTicker(r.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.changed:
		}
		tag, err := r.pool.Exec(ctx, r.q["Heartbeat"], r.cfg.InstanceID, r.leadingJSON())
		if err == nil && tag.RowsAffected() == 0 {
			err = r.register(ctx) // the row was removed (e.g. by an operator): re-register
		}
		if err == nil && r.cfg.InstanceExpiry > 0 {
			tag, err = r.pool.Exec(ctx, r.q["Expire"], r.cfg.InstanceExpiry.Microseconds(), r.cfg.InstanceID)
			if n := tag.RowsAffected(); err == nil && n > 0 {
				r.cfg.Logger.InfoContext(ctx, "annals: expired stale instances", slog.Int64("count", n), slog.Duration("expiry", r.cfg.InstanceExpiry))
			}
		}
		if err != nil && ctx.Err() == nil {
			r.cfg.Logger.WarnContext(ctx, "annals: heartbeat failed", telemetry.Err(err))
		}
	}
}
