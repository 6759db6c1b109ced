package saga

import (
	"context"
	"reflect"
	"sort"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
)

// Typed is a Saga assembled from typed handlers, one per event type:
//
//	s := saga.New[OrderState]("order-fulfilment", reg)
//	saga.On(s, func(e eventstore.Envelope[OrderPlaced]) string { return e.Data.OrderID },
//		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[OrderPlaced]) error {
//			inst.State.Total = e.Data.Total
//			_, err := inst.Append(ctx, "stock-"+e.Data.OrderID, eventstore.NoStream, eventstore.NewEvent(ReserveStock{...}))
//			return err
//		})
//
// Each handler's event type is the name registered for T in the registry;
// the saga's subscriber reads only those types (unless Options.Types says
// otherwise).
type Typed[S any] struct {
	name     string
	reg      *eventstore.Registry
	handlers map[string]typedHandler[S]
	err      error
}

type typedHandler[S any] struct {
	correlate func(e eventstore.Event) (string, error)
	handle    func(ctx context.Context, inst *Instance[S], e eventstore.Event) error
}

// New returns an empty typed saga named name, decoding with reg.
func New[S any](name string, reg *eventstore.Registry) *Typed[S] {
	return &Typed[S]{name: name, reg: reg, handlers: map[string]typedHandler[S]{}}
}

// Registry returns the registry the saga decodes with (New's reg).
func (s *Typed[S]) Registry() *eventstore.Registry { return s.reg }

// On adds the handler of events of type T: correlate returns the instance
// ID of an event (an empty ID is a permanent error), handle applies it.
// Mistakes (T not registered, a second handler for T) are reported by
// Register.
func On[S, T any](s *Typed[S], correlate func(e eventstore.Envelope[T]) string,
	handle func(ctx context.Context, inst *Instance[S], e eventstore.Envelope[T]) error) {
	name, err := handlerType[T](s.reg, s.handlers)
	if err == nil && (correlate == nil || handle == nil) {
		err = errors.Newf("nil function for %q", name)
	}
	if err != nil {
		s.err = errors.CombineErrors(s.err, errors.Wrapf(err, "saga %q", s.name))
		return
	}
	reg := s.reg
	s.handlers[name] = typedHandler[S]{
		correlate: func(e eventstore.Event) (string, error) {
			env, err := eventstore.Decode[T](reg, e)
			if err != nil {
				return "", err
			}
			return correlate(env), nil
		},
		handle: func(ctx context.Context, inst *Instance[S], e eventstore.Event) error {
			env, err := eventstore.Decode[T](reg, e)
			if err != nil {
				return err
			}
			return handle(ctx, inst, env)
		},
	}
}

// Name returns the saga's name.
func (s *Typed[S]) Name() string { return s.name }

// Correlate returns the instance ID of e; events of types without a handler,
// and events that do not decode, are not correlated.
func (s *Typed[S]) Correlate(e eventstore.Event) (string, bool) {
	id, ok, err := s.correlate(e)
	return id, ok && err == nil
}

// correlate is Correlate with the decoding error, which the runtime
// dead-letters.
func (s *Typed[S]) correlate(e eventstore.Event) (string, bool, error) {
	h, ok := s.handlers[e.Type]
	if !ok {
		return "", false, nil
	}
	id, err := h.correlate(e)
	return id, true, err
}

// Handle dispatches e to the handler of its type.
func (s *Typed[S]) Handle(ctx context.Context, inst *Instance[S], e eventstore.Event) error {
	if h, ok := s.handlers[e.Type]; ok {
		return h.handle(ctx, inst, e)
	}
	return nil
}

// EventTypes returns the handled event types.
func (s *Typed[S]) EventTypes() []string {
	out := make([]string, 0, len(s.handlers))
	for k := range s.handlers {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Err returns the mistakes made while adding handlers.
func (s *Typed[S]) Err() error { return s.err }

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
