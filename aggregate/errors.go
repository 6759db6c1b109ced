package aggregate

import (
	"fmt"

	"github.com/cockroachdb/errors"
)

var (
	// ErrNotFound is matched (errors.Is) by Load and Update of an aggregate
	// whose stream has no events. The error also matches
	// eventstore.ErrStreamNotFound.
	ErrNotFound = errors.New("aggregate not found")

	// ErrAlreadyExists is matched by Create when the aggregate's stream
	// already has events. The error also matches
	// eventstore.ErrWrongExpectedVersion.
	ErrAlreadyExists = errors.New("aggregate already exists")

	// ErrUnhandledEvent is what Apply returns for an event type the
	// aggregate does not handle. The repository wraps it with the event's
	// type name, Go type, stream and version.
	ErrUnhandledEvent = errors.New("event type not handled by the aggregate")

	// ErrInvalidID is matched by every call given an empty aggregate ID, or
	// one from which the stream name function makes an empty stream ID or
	// one no append takes (eventstore.CheckStreamID: over
	// eventstore.MaxStreamIDBytes, control characters, invalid UTF-8; the
	// *eventstore.InvalidEventError is reachable with errors.As). Nothing is
	// read or written.
	ErrInvalidID = errors.New("invalid aggregate ID")

	// ErrConflict is matched by Update when every attempt lost the race
	// against concurrent writers of the same aggregate (the retry budget is
	// spent). The error also matches eventstore.ErrWrongExpectedVersion.
	ErrConflict = errors.New("aggregate kept changing concurrently")
)

// marked is err that also matches mark: errors.Is (the standard library's
// and cockroachdb's) finds both mark and everything err wraps, and %+v
// still prints err's stack. (errors.Mark of cockroachdb is not seen by the
// standard library's errors.Is.)
type marked struct {
	err  error
	mark error
}

func mark(err, m error) error { return &marked{err: err, mark: m} }

func (e *marked) Error() string                        { return e.err.Error() }
func (e *marked) Unwrap() error                        { return e.err }
func (e *marked) Is(target error) bool                 { return target == e.mark }
func (e *marked) Format(s fmt.State, verb rune)        { errors.FormatError(e, s, verb) }
func (e *marked) SafeFormatError(errors.Printer) error { return e.err }
