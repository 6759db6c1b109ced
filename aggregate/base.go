package aggregate

import (
	"fmt"
	"reflect"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"

	"github.com/annals-dev/annals/eventstore"
)

// Root is an event-sourced aggregate. Implement Apply and embed Base:
//
//	type Account struct {
//		aggregate.Base
//		Balance int
//	}
//
//	func (a *Account) Apply(event any) error {
//		switch e := event.(type) {
//		case Opened:
//			a.Balance = 0
//		case Deposited:
//			a.Balance += e.Amount
//		default:
//			return aggregate.ErrUnhandledEvent
//		}
//		return nil
//	}
//
// Apply receives each event as the value the registry decodes (a T, not a
// *T), both when the stream is replayed and when a command records a new
// event with Record. It must only change state: no I/O, no validation that
// could reject history. An error (ErrUnhandledEvent for a type the aggregate
// does not know) stops the load; the repository names the event type,
// stream and version in the error it returns.
type Root interface {
	// Apply folds one event into the aggregate's state.
	Apply(event any) error
	// ID, Version, SavedPosition and Uncommitted are Base's.
	ID() string
	Version() int64
	SavedPosition() int64
	Uncommitted() []any
	// root returns the embedded Base; only Base implements it, so an
	// aggregate satisfies Root by embedding Base.
	root() *Base
}

// Base tracks what the repository needs to know about an aggregate: its ID,
// the stream version it was loaded or last saved at (the expected version of
// the next save), the events recorded since, and the log position of the
// last event its last save appended (for read-your-writes). Embed it (by value) in the
// aggregate's struct. Its fields are unexported, so encoding/json leaves them
// out of snapshots.
type Base struct {
	id          string
	version     int64
	position    int64 // of the last event the last successful save appended
	uncommitted []any
	// ids are the event IDs of uncommitted[:len(ids)], given by the first
	// Save that tried to append them and kept until one succeeds, so that a
	// Save made again after an unknown outcome re-appends the same events
	// (an idempotent re-append if the first one was written).
	ids []uuid.UUID
	// from is the first stream version the state folds: the stream's first
	// visible event when the aggregate was loaded (1 unless the stream was
	// truncated or deleted and recreated), or that of the snapshot it was
	// loaded from. 0 for a new aggregate (its events start at 1). A snapshot
	// records it, and a load uses a snapshot only when it is the stream's
	// first visible version.
	from int64
}

func (b *Base) root() *Base { return b }

// ID returns the aggregate's ID (not its stream ID).
func (b *Base) ID() string { return b.id }

// Version returns the stream version the aggregate was loaded or last saved
// at: 0 for a new aggregate. Events recorded since are not counted.
func (b *Base) Version() int64 { return b.version }

// SavedPosition returns the log position (eventstore.Event.GlobalSequence)
// of the last event the aggregate's last successful save appended, as
// eventstore.AppendResult.Position does for an append: the position to
// wait for with annals.Client.Await (or projection.Await) before reading a
// read model that must show the save (read-your-writes):
//
//	acc, err := repo.Update(ctx, "42", func(a *Account) error { return a.Deposit(10) })
//	…
//	err = client.Await(ctx, "balances", acc.SavedPosition())
//
// It is 0 for an aggregate that no save has appended events of since it was
// made or loaded (a Save with nothing recorded appends nothing; an Update
// whose command records nothing returns 0: there is nothing to wait for).
// After a save inside a transaction (SaveTx, CreateTx, UpdateTx) it is the
// position the events have once the transaction commits: wait for it only
// after the commit succeeded. If the transaction rolled back, no event
// has that position and there is nothing to wait for: Await on it returns
// only once later events have carried the projection past it (in every
// partition) or its context ends. After a Save made again following
// ErrOutcomeUnknown that found the events written, it is their stored
// position.
func (b *Base) SavedPosition() int64 { return b.position }

// Uncommitted returns the events recorded since the aggregate was loaded or
// last saved, in order. The slice must not be modified.
func (b *Base) Uncommitted() []any { return b.uncommitted }

// Record applies event to a and, if Apply accepts it, adds it to the events
// the next Save appends. Commands call it once per decision:
//
//	func (a *Account) Deposit(amount int) error {
//		if amount <= 0 {
//			return errors.New("deposit must be positive")
//		}
//		return aggregate.Record(a, Deposited{Amount: amount})
//	}
//
// A pointer event is recorded as the value it points to, as Apply would see
// it after a round trip through the store. A nil event, or a nil aggregate,
// is an error.
func Record(a Root, event any) error {
	if isNil(a) {
		return errors.Newf("aggregate: Record(%T) on a nil aggregate", event)
	}
	if event == nil {
		return errors.Newf("aggregate %s: Record(nil)", typeName(a))
	}
	if v := reflect.ValueOf(event); v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return errors.Newf("aggregate %s: Record(%T(nil))", typeName(a), event)
		}
		event = v.Elem().Interface()
	}
	if err := a.Apply(event); err != nil {
		return applyError(typeName(a), a.root().id, "", event, 0, err)
	}
	b := a.root()
	b.uncommitted = append(b.uncommitted, event)
	return nil
}

// FromHistory returns a new aggregate (from newAgg) with the given ID and
// the events applied as its history: its version is len(history) and it has
// no uncommitted events. It needs no database; the test kit and in-memory
// replays use it. A nil constructor fails, and so does a nil event (or nil
// pointer) in history, matching eventstore.ErrInvalidEvent and naming its
// place ("history event 2 is nil").
func FromHistory[A Root](newAgg func() A, id string, history ...any) (A, error) {
	var zero A
	if newAgg == nil {
		return zero, errors.Newf("aggregate: FromHistory of %s with a nil constructor", reflect.TypeFor[A]())
	}
	a := newAgg()
	if isNil(a) {
		return zero, errors.Newf("aggregate: the constructor of %s returned nil", reflect.TypeFor[A]())
	}
	b := a.root()
	b.id = id
	for i, e := range history {
		if isNilEvent(e) {
			return zero, errors.Wrapf(eventstore.ErrInvalidEvent, "aggregate %s %q: history event %d is nil (%T)", typeName(a), id, i+1, e)
		}
		if err := a.Apply(e); err != nil {
			return zero, applyError(typeName(a), id, "", e, b.version+1, err)
		}
		b.version++
	}
	return a, nil
}

// applyError wraps an Apply failure with the aggregate, the event type (the
// registered name when known, and the Go type) and the event's version.
func applyError(aggType, id, eventType string, event any, version int64, err error) error {
	what := fmt.Sprintf("%T", event)
	if eventType != "" {
		what = eventType + " (" + what + ")"
	}
	if version > 0 {
		return errors.Wrapf(err, "aggregate %s %q: apply event %s at version %d", aggType, id, what, version)
	}
	return errors.Wrapf(err, "aggregate %s %q: apply event %s", aggType, id, what)
}

func typeName(a any) string {
	t := reflect.TypeOf(a)
	if t == nil {
		return "<nil>"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.String()
}

// isNilEvent reports whether an event is nil or a nil pointer.
func isNilEvent(e any) bool {
	if e == nil {
		return true
	}
	v := reflect.ValueOf(e)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

func isNil(a any) bool {
	if a == nil {
		return true
	}
	v := reflect.ValueOf(a)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}
