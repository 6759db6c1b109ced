package eventstore

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"

	"github.com/cockroachdb/errors"
)

// SchemaVersionKey is the metadata key (in Metadata.Extra) that holds the
// schema version of an event's data: a positive integer. An event without
// it is at version 1.
const SchemaVersionKey = "schema_version"

// Upcaster transforms the JSON data of an event from one schema version to
// the next. It must be a pure function of its input: it runs on every read
// of an old event, in every process, and the stored event never changes.
type Upcaster func(data json.RawMessage) (json.RawMessage, error)

var (
	// ErrInvalidUpcaster is matched by a rejected upcaster registration: a
	// gap in a type's chain of versions, a second upcaster for the same
	// version, an empty type name or a nil function.
	ErrInvalidUpcaster = errors.New("invalid upcaster registration")

	// ErrUpcast is matched when a stored event cannot be brought to its
	// type's current schema version: an upcaster failed or returned invalid
	// JSON, the event's schema_version is malformed, or it is newer than
	// the newest version the registry knows (written by newer code).
	ErrUpcast = errors.New("cannot upcast event")
)

// RegisterUpcaster adds the upcaster that turns the data of events of type
// eventType from schema version fromVersion to fromVersion+1. A type's
// chain starts at version 1 and is registered in order (1→2, then 2→3, …);
// its current version is one more than the last registered fromVersion, or
// 1 without upcasters. Errors (ErrInvalidUpcaster): an upcaster for
// fromVersion exists already, or fromVersion skips a version.
//
// With a chain registered, appends of eventType stamp the current version in
// the metadata (SchemaVersionKey), reads (ReadAll, ReadStream, Decode,
// Decode[T], and the runner of package projection when it is given the
// registry) see the data upcast to the current version with the metadata's
// version set to it, and the stored events stay as they were written.
//
// eventType need not be registered as a Go type (Register): events that
// are only read as raw JSON (ReadAll, ReadStream, Upcast, untyped
// projection handlers) are upcast too, and a type may be registered before
// or after its upcasters.
//
// Register upcasters before the registry is used: the chain of a type is
// read without locking, so a chain completed later is only seen by later
// reads.
func (r *Registry) RegisterUpcaster(eventType string, fromVersion int, fn Upcaster) error {
	switch {
	case eventType == "":
		return errors.Wrap(ErrInvalidUpcaster, "the event type name is empty")
	case fn == nil:
		return errors.Wrapf(ErrInvalidUpcaster, "upcaster of %q from version %d is nil", eventType, fromVersion)
	case fromVersion < 1:
		return errors.Wrapf(ErrInvalidUpcaster, "upcaster of %q from version %d: versions start at 1", eventType, fromVersion)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.upcasters.Load()
	chain := []Upcaster(nil)
	if old != nil {
		chain = (*old)[eventType]
	}
	current := len(chain) + 1
	switch {
	case fromVersion < current:
		return errors.Wrapf(ErrInvalidUpcaster, "an upcaster of %q from version %d to %d is already registered", eventType, fromVersion, fromVersion+1)
	case fromVersion > current:
		return errors.Wrapf(ErrInvalidUpcaster, "upcaster of %q from version %d leaves a gap: the type is at version %d, so the next upcaster is from version %d", eventType, fromVersion, current, current)
	}
	next := map[string][]Upcaster{}
	if old != nil {
		maps.Copy(next, *old)
	}
	next[eventType] = append(chain[:len(chain):len(chain)], fn)
	r.upcasters.Store(&next)
	return nil
}

// MustRegisterUpcaster is RegisterUpcaster that panics on error, for
// package initialization.
func (r *Registry) MustRegisterUpcaster(eventType string, fromVersion int, fn Upcaster) {
	if err := r.RegisterUpcaster(eventType, fromVersion, fn); err != nil {
		panic(err)
	}
}

// SchemaVersion returns the current schema version of eventType: 1 plus
// the number of its registered upcasters.
func (r *Registry) SchemaVersion(eventType string) int {
	return len(r.chain(eventType)) + 1
}

func (r *Registry) chain(eventType string) []Upcaster {
	if r == nil {
		return nil
	}
	m := r.upcasters.Load()
	if m == nil {
		return nil
	}
	return (*m)[eventType]
}

// SchemaVersion returns the schema version recorded in m
// (SchemaVersionKey): 1 when there is none, an error when it is not a
// positive integer.
func (m Metadata) SchemaVersion() (int, error) {
	raw, ok := m.Extra[SchemaVersionKey]
	if !ok {
		return 1, nil
	}
	v, err := schemaVersionOf(raw)
	return v, errors.Wrap(err, "metadata")
}

// schemaVersionOf returns the schema version raw (the value of
// SchemaVersionKey) holds, or an error that names the key, not the
// metadata: callers say where it is.
func schemaVersionOf(raw any) (int, error) {
	var f float64
	switch v := raw.(type) {
	case float64:
		f = v
	case int:
		f = float64(v)
	case int64:
		f = float64(v)
	case json.Number:
		var err error
		if f, err = v.Float64(); err != nil {
			return 0, errors.Newf("%s %q is not a positive integer", SchemaVersionKey, v)
		}
	default:
		return 0, errors.Newf("%s %v (%T) is not a positive integer", SchemaVersionKey, raw, raw)
	}
	if f < 1 || f != math.Trunc(f) || f > math.MaxInt32 {
		return 0, errors.Newf("%s %v is not a positive integer", SchemaVersionKey, raw)
	}
	return int(f), nil
}

// Upcast returns e with its data brought to the current schema version of
// its type by the registered upcasters, and its metadata's SchemaVersionKey
// set to that version. An event already at the current version, or of a
// type without upcasters, is returned as is. Errors match ErrUpcast. Reads
// through a Store, Decode and Decode[T] call it; call it yourself for events
// obtained otherwise. Before upcasting, it decrypts the event's personal
// fields (PersonalData) with the key ring a Store attached to r, or redacts
// them when their subject is forgotten; a key it cannot unwrap fails with
// ErrKeyUnwrap, a field it cannot decrypt with ErrDecrypt.
func (r *Registry) Upcast(e Event) (Event, error) {
	e, err := r.reveal(e)
	if err != nil {
		return e, err
	}
	chain := r.chain(e.Type)
	if len(chain) == 0 {
		return e, nil
	}
	from, err := e.Metadata.SchemaVersion()
	if err != nil {
		return e, upcastError(errors.Wrapf(err, "event %d (%s, stream %s v%d)", e.GlobalSequence, e.Type, e.StreamID, e.StreamVersion), ErrUpcast)
	}
	current := len(chain) + 1
	switch {
	case from == current:
		return e, nil
	case from > current:
		return e, errors.Wrapf(ErrUpcast, "event %d (%s, stream %s v%d) has schema version %d, newer than %d, the newest this registry knows",
			e.GlobalSequence, e.Type, e.StreamID, e.StreamVersion, from, current)
	}
	data := e.Data
	for v := from; v < current; v++ {
		out, err := chain[v-1](data)
		if err == nil && !json.Valid(out) {
			err = errors.New("the upcaster returned invalid JSON")
		}
		if err != nil {
			return e, upcastError(errors.Wrapf(err, "upcast event %d (%s, stream %s v%d) from schema version %d to %d",
				e.GlobalSequence, e.Type, e.StreamID, e.StreamVersion, v, v+1), ErrUpcast)
		}
		data = out
	}
	e.Data = data
	e.Metadata.Extra = maps.Clone(e.Metadata.Extra)
	if e.Metadata.Extra == nil {
		e.Metadata.Extra = map[string]any{}
	}
	e.Metadata.Extra[SchemaVersionKey] = current
	return e, nil
}

// stamp returns the metadata an append stores for an event of type name:
// a schema version set explicitly must be a positive integer not newer than
// the type's current version; without one, the current version is added
// when the type has upcasters (version 1 is the default and not stored).
// Its errors describe the metadata's content; the caller names the
// metadata (InvalidEventError.Field).
func (r *Registry) stamp(name string, md Metadata) (Metadata, error) {
	current := r.SchemaVersion(name)
	if raw, ok := md.Extra[SchemaVersionKey]; ok {
		v, err := schemaVersionOf(raw)
		if err != nil {
			return md, err
		}
		if v > current && current > 1 {
			return md, errors.Newf("%s %d is newer than %d, the current version of %q", SchemaVersionKey, v, current, name)
		}
		return md, nil
	}
	if current == 1 {
		return md, nil
	}
	extra := make(map[string]any, len(md.Extra)+1)
	maps.Copy(extra, md.Extra)
	extra[SchemaVersionKey] = current
	md.Extra = extra
	return md, nil
}

// marked is err that also matches ErrUpcast: errors.Is (the standard
// library's and cockroachdb's) finds ErrUpcast and everything err wraps, and
// %+v still prints err's stack. (errors.Mark of cockroachdb is not seen by
// the standard library's errors.Is.)
type marked struct {
	err  error
	mark error
}

func upcastError(err, mark error) error { return &marked{err: err, mark: mark} }

func (e *marked) Error() string                        { return e.err.Error() }
func (e *marked) Unwrap() error                        { return e.err }
func (e *marked) Is(target error) bool                 { return target == e.mark }
func (e *marked) Format(s fmt.State, verb rune)        { errors.FormatError(e, s, verb) }
func (e *marked) SafeFormatError(errors.Printer) error { return e.err }
