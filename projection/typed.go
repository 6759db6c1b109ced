package projection

import (
	"context"
	"reflect"
	"sort"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/failure"
)

// Typed is a Projection assembled from typed handlers:
//
//	p := projection.New("balances", reg)
//	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Deposited]) error {
//		_, err := tx.Exec(ctx, `UPDATE balances SET amount = amount + $2 WHERE id = $1`, e.StreamID, e.Data.Amount)
//		return err
//	})
//
// Each handler's event type is the name registered for T in the registry.
// Events of other types are not read at all (the runner filters by the
// handled types).
type Typed struct {
	name     string
	reg      *eventstore.Registry
	handlers map[string]func(ctx context.Context, tx pgx.Tx, e eventstore.Event) error
	reset    func(ctx context.Context, tx pgx.Tx) error
	setup    func(ctx context.Context, tx pgx.Tx) error
	setupV   int
	err      error
}

// New returns an empty typed projection named name, decoding with reg.
func New(name string, reg *eventstore.Registry) *Typed {
	return &Typed{name: name, reg: reg, handlers: map[string]func(context.Context, pgx.Tx, eventstore.Event) error{}}
}

// On adds the handler for events of type T. Mistakes (T not registered, a
// second handler for T, a nil fn) are reported by Runner.Register.
func On[T any](p *Typed, fn func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[T]) error) {
	name, err := handlerType[T](p.reg, p.handlers)
	if err == nil && fn == nil {
		err = errors.Newf("nil handler function for %q", name)
	}
	if err != nil {
		p.err = errors.CombineErrors(p.err, errors.Wrapf(err, "projection %q", p.name))
		return
	}
	reg := p.reg
	p.handlers[name] = func(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
		env, err := decode[T](reg, e)
		if err != nil {
			return err
		}
		return fn(ctx, tx, env)
	}
}

// OnReset sets the function that clears the read model for a rebuild.
func (p *Typed) OnReset(fn func(ctx context.Context, tx pgx.Tx) error) { p.reset = fn }

// OnSetup sets the function that creates the read model (its tables and
// indexes) and its version: the runner runs it before the projection first
// runs, once per version per database, under a lock (see Setupper and
// EnsureSetup), and a rebuild before its Reset. Bump version when fn
// changes; fn then runs over what the previous version made. Statements
// makes fn from SQL. A version below 1 is reported by Runner.Register.
func (p *Typed) OnSetup(version int, fn func(ctx context.Context, tx pgx.Tx) error) {
	if version < 1 || fn == nil {
		p.err = errors.CombineErrors(p.err, errors.Newf("projection %q: OnSetup(%d, %p): the version must be at least 1 and fn not nil", p.name, version, fn))
		return
	}
	p.setup, p.setupV = fn, version
}

// SetupVersion returns the version given to OnSetup, or 0.
func (p *Typed) SetupVersion() int { return p.setupV }

// Setup runs the function given to OnSetup (no-op without one).
func (p *Typed) Setup(ctx context.Context, tx pgx.Tx) error {
	if p.setup == nil {
		return nil
	}
	return p.setup(ctx, tx)
}

// Name returns the projection's name.
func (p *Typed) Name() string { return p.name }

// Handle dispatches e to the handler for its type; other types are ignored.
func (p *Typed) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if h, ok := p.handlers[e.Type]; ok {
		return h(ctx, tx, e)
	}
	return nil
}

// Reset clears the read model (no-op without OnReset).
func (p *Typed) Reset(ctx context.Context, tx pgx.Tx) error {
	if p.reset == nil {
		return nil
	}
	return p.reset(ctx, tx)
}

// EventTypes returns the handled event types.
func (p *Typed) EventTypes() []string { return keys(p.handlers) }

// Err returns the mistakes made while adding handlers.
func (p *Typed) Err() error { return p.err }

// Registry returns the registry the projection decodes with (New's reg).
func (p *Typed) Registry() *eventstore.Registry { return p.reg }

// TypedObserver is an Observer assembled from typed handlers (see Typed).
type TypedObserver struct {
	name     string
	reg      *eventstore.Registry
	handlers map[string]func(ctx context.Context, e eventstore.Event) error
	err      error
}

// NewObserver returns an empty typed observer named name, decoding with reg.
func NewObserver(name string, reg *eventstore.Registry) *TypedObserver {
	return &TypedObserver{name: name, reg: reg, handlers: map[string]func(context.Context, eventstore.Event) error{}}
}

// Registry returns the registry the observer decodes with (NewObserver's
// reg).
func (o *TypedObserver) Registry() *eventstore.Registry { return o.reg }

// Observe adds the observer's handler for events of type T. Mistakes (T
// not registered, a second handler for T, a nil fn) are reported by
// Runner.Register.
func Observe[T any](o *TypedObserver, fn func(ctx context.Context, e eventstore.Envelope[T]) error) {
	name, err := handlerType[T](o.reg, o.handlers)
	if err == nil && fn == nil {
		err = errors.Newf("nil handler function for %q", name)
	}
	if err != nil {
		o.err = errors.CombineErrors(o.err, errors.Wrapf(err, "observer %q", o.name))
		return
	}
	reg := o.reg
	o.handlers[name] = func(ctx context.Context, e eventstore.Event) error {
		env, err := decode[T](reg, e)
		if err != nil {
			return err
		}
		return fn(ctx, env)
	}
}

// Name returns the observer's name.
func (o *TypedObserver) Name() string { return o.name }

// Handle dispatches e to the handler for its type; other types are ignored.
func (o *TypedObserver) Handle(ctx context.Context, e eventstore.Event) error {
	if h, ok := o.handlers[e.Type]; ok {
		return h(ctx, e)
	}
	return nil
}

// EventTypes returns the handled event types.
func (o *TypedObserver) EventTypes() []string { return keys(o.handlers) }

// Err returns the mistakes made while adding handlers.
func (o *TypedObserver) Err() error { return o.err }

// decode is eventstore.Decode[T] for a typed handler: one call, which
// upcasts the event once (an event the runner's Config.Registry upcast
// already is current, and only has its version checked), with its
// failures told apart by the error's mark. An event that cannot be upcast
// (or its personal fields decrypted, which may read keys from the
// database) fails as Upcast does, and is retried by the RetryPolicy like
// any handler error; an upcast event whose data does not decode into T
// (eventstore.ErrDecode: a JSON error, personal fields still encrypted for
// want of a KEK) is a permanent failure (failure.Permanent), dead-lettered
// after this one attempt, since the same data cannot decode at a retry
// either.
func decode[T any](reg *eventstore.Registry, e eventstore.Event) (eventstore.Envelope[T], error) {
	env, err := eventstore.Decode[T](reg, e)
	if errors.Is(err, eventstore.ErrDecode) {
		err = failure.Permanent(err)
	}
	return env, err
}

func handlerType[T any, H any](reg *eventstore.Registry, handlers map[string]H) (string, error) {
	if reg == nil {
		return "", errors.New("no event registry")
	}
	var zero T
	name, ok := reg.NameOf(zero)
	if !ok {
		return "", errors.Wrapf(eventstore.ErrUnknownEventType, "%s is not registered", reflect.TypeFor[T]())
	}
	if _, dup := handlers[name]; dup {
		return "", errors.Newf("a second handler for %q", name)
	}
	return name, nil
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
