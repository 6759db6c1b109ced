package eventstore

import (
	"encoding/json"
	"fmt"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/migrations"
)

// SQLSTATE codes raised by annals.append_events and the events table.
// They are part of the SQL API (docs/sql-api.md).
const (
	// CodeWrongExpectedVersion: the stream's version is not the expected one.
	// The error's DETAIL is a JSON object with stream_id, expected_version
	// and actual_version.
	CodeWrongExpectedVersion = "AN001"
	// CodeInvalidEvent: the input is malformed; nothing was written.
	CodeInvalidEvent = "AN002"
	// CodeEventIDConflict: an event ID in the append is already stored as a
	// different event (or only some of the append's events are stored).
	CodeEventIDConflict = "AN003"
	// CodeAppendOnly: an UPDATE, DELETE or TRUNCATE of the events table.
	CodeAppendOnly = "AN004"
	// CodeStreamDeleted: the stream is deleted (soft); only an append that
	// expects exactly its version recreates it. DETAIL: {"stream_id",
	// "version", "hard": false}.
	CodeStreamDeleted = "AN005"
	// CodeStreamTombstoned: the stream is hard-deleted and takes no appends,
	// ever. DETAIL: {"stream_id", "version", "hard": true}.
	CodeStreamTombstoned = "AN006"
)

var (
	// ErrWrongExpectedVersion is matched (errors.Is) by an append whose
	// expected version did not hold. Use errors.As with
	// *WrongExpectedVersionError to read the actual version.
	ErrWrongExpectedVersion = errors.New("wrong expected version")

	// ErrStreamNotFound is returned when reading a stream that has no events,
	// and is also matched by a WrongExpectedVersionError for StreamExists.
	ErrStreamNotFound = errors.New("stream not found")

	// ErrInvalidEvent is matched by every rejection of malformed input,
	// whether the Go client or the SQL function (SQLSTATE AN002) found it: a
	// stream ID or event type that is empty, only whitespace, too long, not
	// UTF-8 or holds control characters; data that is not a JSON object or
	// array or that PostgreSQL cannot store; an oversized event; a reserved
	// metadata key misused; a bad expected version (see the limits in
	// limits.go and docs/guarantees.md). Most are an *InvalidEventError
	// (errors.As) naming the event, the field and the limit. Nothing is written.
	ErrInvalidEvent = errors.New("invalid event")

	// ErrUnknownEventType is returned when a Go value has no registered event
	// type name, or a stored event's type has no registered Go type.
	ErrUnknownEventType = errors.New("unknown event type")

	// ErrDecode is matched (errors.Is) when Decode or Registry.Decode cannot
	// decode an event's data, upcast to its type's current schema version,
	// into the registered Go type: a JSON error (errors.As still finds
	// encoding/json's error), such as that of personal fields still
	// encrypted for want of a KEK (Decode marks that with ErrNoKEK too).
	// The same data fails again at any retry. A failed upcast or decryption
	// (ErrUpcast, ErrDecrypt, a key that could not be read) and an
	// unregistered type (ErrUnknownEventType) do not match it.
	ErrDecode = errors.New("cannot decode event data")

	// ErrEventIDConflict is returned when an event ID is already stored for a
	// different event. Re-appending exactly the same events is not an error.
	ErrEventIDConflict = errors.New("event ID already used by a different event")

	// ErrAppendOnly is returned when something tries to change or delete stored events.
	ErrAppendOnly = errors.New("events are append-only")
)

// WrongExpectedVersionError reports an append whose expected version did not
// hold. It matches ErrWrongExpectedVersion, and ErrStreamNotFound when the
// stream does not exist.
type WrongExpectedVersionError struct {
	// StreamID is the stream appended to.
	StreamID string
	// Expected is the expected version the append carried.
	Expected ExpectedVersion
	// Actual is the stream's version at the time of the append (0: no stream).
	Actual int64
}

func (e *WrongExpectedVersionError) Error() string {
	return fmt.Sprintf("wrong expected version for stream %q: expected %s, actual %d", e.StreamID, e.Expected, e.Actual)
}

// Is makes errors.Is match ErrWrongExpectedVersion, and ErrStreamNotFound when
// the stream does not exist.
func (e *WrongExpectedVersionError) Is(target error) bool {
	return target == ErrWrongExpectedVersion || (target == ErrStreamNotFound && e.Actual == 0)
}

func invalidf(format string, args ...any) error {
	return errors.WithStackDepth(errors.Wrapf(ErrInvalidEvent, format, args...), 1)
}

// translate maps the SQLSTATEs of append_events to the package's typed errors.
func translate(err error, streamID string, expected ExpectedVersion) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case CodeWrongExpectedVersion:
		var d struct {
			Actual int64 `json:"actual_version"`
		}
		if jerr := json.Unmarshal([]byte(pgErr.Detail), &d); jerr != nil {
			return errors.Wrapf(err, "annals: cannot read the actual version from %q", pgErr.Detail)
		}
		return errors.WithStack(&WrongExpectedVersionError{StreamID: streamID, Expected: expected, Actual: d.Actual})
	case CodeInvalidEvent:
		return errors.WithStack(invalidFromSQL(pgErr))
	case CodeEventIDConflict:
		return errors.Wrap(ErrEventIDConflict, pgErr.Message)
	case CodeAppendOnly:
		return errors.Wrap(ErrAppendOnly, pgErr.Message)
	case CodeStreamDeleted, CodeStreamTombstoned:
		return streamDeletedFromSQL(pgErr, streamID)
	case "3F000", "42P01": // invalid_schema_name, undefined_table
		return errors.Wrap(migrations.MarkNotMigrated(err),
			"annals: the schema is not migrated (Client.Start migrates it; or migrations.Up, or 'annals migrate')")
	}
	return err
}

// invalidFromSQL turns an AN002 error into an *InvalidEventError. The checks
// of check_event_input put {"event", "field", "limit", "actual"} in the
// error's DETAIL; older checks carry only a message.
func invalidFromSQL(pgErr *pgconn.PgError) *InvalidEventError {
	var d struct {
		Event  int    `json:"event"`
		Field  string `json:"field"`
		Limit  int    `json:"limit"`
		Actual int    `json:"actual"`
	}
	e := &InvalidEventError{Reason: pgErr.Message, sqlMessage: true}
	if pgErr.Detail != "" && json.Unmarshal([]byte(pgErr.Detail), &d) == nil && d.Field != "" {
		e.Event, e.Field, e.Limit, e.Actual = d.Event, d.Field, d.Limit, d.Actual
	}
	return e
}
