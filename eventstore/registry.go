package eventstore

import (
	"bytes"
	"encoding"
	"encoding/json"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/internal/errmark"
)

// Registry maps event type names to Go types and back, so that appends can
// name events from their Go values and reads can decode them into typed
// values. It is safe for concurrent use.
type Registry struct {
	mu     sync.RWMutex
	byName map[string]reflect.Type
	byType map[reflect.Type]string
	// upcasters maps an event type to its chain (index i: version i+1 to
	// i+2); replaced whole on registration, so reads need no lock.
	upcasters atomic.Pointer[map[string][]Upcaster]
	// personal maps event types with personal data to their fields
	// (PersonalData); keys decrypts them on reads (set by New).
	personal map[string]*personalSpec
	keys     atomic.Pointer[keyring]
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{byName: map[string]reflect.Type{}, byType: map[reflect.Type]string{}, personal: map[string]*personalSpec{}}
}

// Register records that events of type name decode into T (and that a T
// appended without a Type is named name). A name or Go type may be registered
// once; registering the same pair again is a no-op. Options: PersonalData
// (a type with fields tagged `annals:"personal"` must name its subject so).
//
// Event data is a JSON object or array, so T is a struct, map, slice or
// array, or has a MarshalJSON method; a type whose JSON is surely something
// else (a number, string or bool, a byte slice, which encodes as a base64
// string, or a type with only a MarshalText method) is refused
// (ErrInvalidEvent), as is a pointer type (register its element type).
func Register[T any](r *Registry, name string, opts ...RegisterOption) error {
	t := reflect.TypeFor[T]()
	if name == "" {
		return invalidf("cannot register %s under an empty event type name", t)
	}
	if t.Kind() == reflect.Pointer {
		return invalidf("register the element type of %s, not a pointer", t)
	}
	if why := notJSONContainer(t); why != "" {
		return invalidf("cannot register %s as event type %q: %s, and event data must be a JSON object or array", t, name, why)
	}
	var o registration
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return errmark.Mark(err, ErrInvalidEvent)
		}
	}
	spec, err := personalSpecOf(t, o)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if have, ok := r.byName[name]; ok && have != t {
		return errors.Newf("event type %q is already registered for %s", name, have)
	}
	if have, ok := r.byType[t]; ok && have != name {
		return errors.Newf("%s is already registered as event type %q", t, have)
	}
	r.byName[name] = t
	r.byType[t] = name
	if spec != nil {
		if r.personal == nil {
			r.personal = map[string]*personalSpec{}
		}
		r.personal[name] = spec
	}
	return nil
}

var (
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// notJSONContainer returns why encoding/json surely encodes every value of
// t as something other than a JSON object or array, or "" when some value
// may encode as one (a MarshalJSON method, on T or *T, may return anything;
// an interface type holds values of other types).
func notJSONContainer(t reflect.Type) string {
	if t.Kind() == reflect.Interface || t.Implements(jsonMarshalerType) || reflect.PointerTo(t).Implements(jsonMarshalerType) {
		return ""
	}
	if t.Implements(textMarshalerType) {
		return "its MarshalText method makes its JSON a string"
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map, reflect.Array:
		return ""
	case reflect.Slice:
		// encoding/json's rule for []byte: a slice of a uint8 kind whose
		// pointer has neither marshaler is a base64 string.
		if p := reflect.PointerTo(t.Elem()); t.Elem().Kind() == reflect.Uint8 && !p.Implements(jsonMarshalerType) && !p.Implements(textMarshalerType) {
			return "its JSON is a base64 string (use json.RawMessage for raw JSON)"
		}
		return ""
	case reflect.String:
		return "its JSON is a string"
	case reflect.Bool:
		return "its JSON is true or false"
	case reflect.Chan, reflect.Func, reflect.Complex64, reflect.Complex128, reflect.UnsafePointer:
		return "encoding/json cannot encode a " + t.Kind().String()
	}
	return "its JSON is a number" // the integer and float kinds
}

// MustRegister is Register that panics on error, for package initialization.
func MustRegister[T any](r *Registry, name string, opts ...RegisterOption) {
	if err := Register[T](r, name, opts...); err != nil {
		panic(err)
	}
}

// NameOf returns the event type name registered for v's Go type (v may be a
// pointer to it).
func (r *Registry) NameOf(v any) (string, bool) {
	t := reflect.TypeOf(v)
	if t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	name, ok := r.byType[t]
	return name, ok
}

// Types returns the registered event type names.
func (r *Registry) Types() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.byName))
	for n := range r.byName {
		out = append(out, n)
	}
	return out
}

// Decode decodes e's data, upcast to the current schema version (see
// RegisterUpcaster), into a new value of the Go type registered for e.Type
// and returns it (a T, not a *T). An unregistered type returns
// ErrUnknownEventType; a failed upcast ErrUpcast; data that does not decode
// into the type ErrDecode (also ErrNoKEK when that is because its personal
// fields are still encrypted).
func (r *Registry) Decode(e Event) (any, error) {
	e, err := r.Upcast(e)
	if err != nil {
		return nil, err
	}
	r.mu.RLock()
	t, ok := r.byName[e.Type]
	r.mu.RUnlock()
	if !ok {
		return nil, errors.Wrapf(ErrUnknownEventType, "event %d has type %q, which is not registered", e.GlobalSequence, e.Type)
	}
	p := reflect.New(t)
	if err := json.Unmarshal(e.Data, p.Interface()); err != nil {
		return nil, decodeError(err, e, t)
	}
	return p.Elem().Interface(), nil
}

// decodeError is the error of Decode and Registry.Decode when e's data does
// not decode into t: it matches ErrDecode, and ErrNoKEK too when e still
// holds encrypted personal fields (read by a Store without a KEK).
func decodeError(err error, e Event, t reflect.Type) error {
	err = errors.Wrapf(err, "decode event %d of type %q into %s", e.GlobalSequence, e.Type, t)
	if bytes.Contains(e.Data, personalMarker) {
		err = errmark.Mark(errors.Wrap(err, "its personal fields are encrypted (read it through a Store with Config.KEK)"), ErrNoKEK)
	}
	return errmark.Mark(err, ErrDecode)
}

// Envelope is a stored event with its payload decoded into T. Data shadows
// the embedded Event.Data (the raw JSON, still reachable as e.Event.Data).
type Envelope[T any] struct {
	Event
	// Data is the decoded payload.
	Data T
}

// Decode decodes e into an Envelope[T], upcasting its data to the current
// schema version first (the envelope's Event is the upcast event). It fails
// with ErrUnknownEventType when e.Type is not the name registered for T,
// with ErrUpcast when the upcast fails, and with ErrDecode when the upcast
// data does not decode into T (also ErrNoKEK when that is because its
// personal fields are still encrypted).
func Decode[T any](r *Registry, e Event) (Envelope[T], error) {
	var env Envelope[T]
	t := reflect.TypeFor[T]()
	r.mu.RLock()
	name, ok := r.byType[t]
	r.mu.RUnlock()
	if !ok {
		return env, errors.Wrapf(ErrUnknownEventType, "%s is not registered", t)
	}
	if name != e.Type {
		return env, errors.Wrapf(ErrUnknownEventType, "event %d has type %q, not %q (%s)", e.GlobalSequence, e.Type, name, t)
	}
	e, err := r.Upcast(e)
	if err != nil {
		return env, err
	}
	if err := json.Unmarshal(e.Data, &env.Data); err != nil {
		return env, decodeError(err, e, t)
	}
	env.Event = e
	return env, nil
}
