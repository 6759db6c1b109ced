package eventstore

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/internal/errmark"
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

	// ErrStreamChanged ends a ReadStream that spans several pages when the
	// stream changed between two of them in a way that would make the
	// events yielded not one stream as it was at any moment: deleted (soft:
	// the rest would read as nothing; it also matches ErrStreamDeleted),
	// deleted and recreated, or truncated past the next version to read
	// (its retention, or its max age reached it). Read the stream again.
	ErrStreamChanged = errors.New("stream changed while it was read")

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
	// encrypted for want of a KEK (both mark that with ErrNoKEK too).
	// The same data fails again at any retry. A failed upcast or decryption
	// (ErrUpcast, ErrDecrypt, a key that could not be read) and an
	// unregistered type (ErrUnknownEventType) do not match it.
	ErrDecode = errors.New("cannot decode event data")

	// ErrEventIDConflict is returned when an event ID is already stored for a
	// different event. Re-appending exactly the same events is not an error.
	ErrEventIDConflict = errors.New("event ID already used by a different event")

	// ErrAppendOnly is returned when something tries to change or delete stored events.
	ErrAppendOnly = errors.New("events are append-only")

	// ErrNotWritten is matched (errors.Is, the standard library's or
	// cockroachdb's) by the error of a Store.Append that was never sent: its
	// context ended before it was (the error matches the context's error
	// too), or no connection could be had for it. Nothing was written; the
	// append may be made again as it is.
	ErrNotWritten = errors.New("append not sent: nothing was written")

	// ErrNotGranted is matched (errors.Is, the standard library's or
	// cockroachdb's) by the error of an append, a delete or a Forget that
	// PostgreSQL refused because the session's role may not execute the
	// function it calls (SQLSTATE 42501, insufficient_privilege; errors.As
	// still finds the *pgconn.PgError). The role needs the grants of its
	// kind: run `annals grant writer ROLE` (or runner, operator;
	// migrations.Grant) as the schema's owner. Nothing was written; the
	// transaction of AppendTx or Transact is aborted.
	//
	// An append in a transaction meets it, when its role may execute
	// append_events only, if that changed after the Store asked about the
	// session's roles (an annals grant older than migration 0035 granted
	// the role since, or made the session's user a member of it): the Store
	// then asks again at the next append, which goes through append_events
	// (a Store without group commit re-sends a lone Append so itself).
	//
	// A runner's start matches it too when its role may not use the
	// subscriber_layouts table (catchup.Engine.CheckLayout): a role granted
	// by an annals older than migration 0022, until `annals grant runner
	// ROLE` runs again.
	ErrNotGranted = errors.New("the session's role lacks the grants this needs: run 'annals grant writer ROLE' (or runner, operator) as the schema's owner")

	// ErrOutcomeUnknown is matched (errors.Is, the standard library's or
	// cockroachdb's) by the error of an append whose outcome the client did
	// not learn: its context ended (the error matches the context's error
	// too), its connection was lost, or its session ended, while its
	// statement was on its way. It may have been written. The error is an
	// *OutcomeUnknownError (errors.As), which holds the event IDs the append
	// was sent with: append the same events again with those IDs
	// (EventData.ID) to learn the outcome; that is idempotent (see
	// OutcomeUnknownError). A Transact whose appends and COMMIT got no
	// answer matches it too (see Transact).
	ErrOutcomeUnknown = errors.New("append outcome unknown: it may have been written")
)

// OutcomeUnknownError is the error of an append whose outcome is unknown
// (ErrOutcomeUnknown, which it matches): it may have been written. Its
// cause (errors.Unwrap) is what ended the wait for the answer: the caller's
// context error, or the connection's.
//
// To find out, append the same events (same stream, types and data) again
// with EventIDs as their IDs (EventData.ID): if the first append was
// written, the second returns its stored positions and writes nothing,
// whatever its expected version says (an idempotent re-append); if it was
// not, the second appends the events, checking its expected version as
// any append does. Keep the expected version of the first attempt: with
// Exact(n) or NoStream, a stream that some other writer moved meanwhile
// makes the second fail with ErrWrongExpectedVersion only if the first was
// not written. (An event of a type with personal data whose ID annals
// generated was encrypted under a random nonce, and its re-append with
// EventIDs seals it differently: it then answers ErrEventIDConflict if the
// first was written, since only that append stored the ID. Give such
// events IDs of your own if you may retry them.)
type OutcomeUnknownError struct {
	// StreamID is the stream appended to.
	StreamID string
	// EventIDs are the IDs the append's events were sent with, in order:
	// the caller's, or those annals generated.
	EventIDs []uuid.UUID
	err      error
}

func (e *OutcomeUnknownError) Error() string { return e.err.Error() }

// Unwrap returns the cause: the context's error, or the connection's.
func (e *OutcomeUnknownError) Unwrap() error { return e.err }

// Is makes errors.Is match ErrOutcomeUnknown.
func (e *OutcomeUnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

// Format prints the error as its cause prints itself (%+v keeps the stack).
func (e *OutcomeUnknownError) Format(s fmt.State, verb rune) { errors.FormatError(e, s, verb) }

// FormatError implements errors.Formatter: with %+v it names the stream and
// the event IDs.
func (e *OutcomeUnknownError) FormatError(p errors.Printer) error {
	if p.Detail() {
		p.Printf("outcome unknown: stream %q, event IDs %v", e.StreamID, e.EventIDs)
	}
	return e.err
}

// The messages of an append's context end: before it was sent, and after.
const (
	notSent = "eventstore: append cancelled before it was sent; nothing was written"
	// retryHint ends the message of every outcome-unknown error.
	retryHint     = "; it may have been written (append the same events again with the event IDs of this OutcomeUnknownError to find out: that is idempotent)"
	maybeWritten  = "eventstore: append cancelled while its group was committing" + retryHint
	cancelledSent = "eventstore: append cancelled while it was committing" + retryHint
	answerMissing = "eventstore: append sent, but its answer was lost" + retryHint
)

// notWritten is the error of an append whose context ended before it was sent.
func notWritten(ctxErr error) error {
	return errmark.Mark(errors.WrapWithDepth(1, ctxErr, notSent), ErrNotWritten)
}

// failedErr is the error of append a, made for ctx, whose statement failed
// with err: ErrNotWritten when err says the statement was never sent (no
// connection could be had, say), an *OutcomeUnknownError when no answer
// came (a connection lost mid-statement, a session terminated), err itself
// when the server's answer says the append failed. Either marker matches
// ctx's error too when ctx has ended.
func failedErr(ctx context.Context, a *appendArgs, err error) error {
	cerr := ctx.Err()
	switch {
	case unsent(err) && cerr != nil:
		return notWritten(errors.WithSecondaryError(cerr, err))
	case unsent(err):
		return errmark.Mark(errors.Wrap(err, "eventstore: append not sent; nothing was written"), ErrNotWritten)
	case answered(err):
		return err
	case cerr != nil:
		return outcomeUnknown(a, errors.WithSecondaryError(cerr, err), cancelledSent)
	default:
		return outcomeUnknown(a, err, answerMissing)
	}
}

// outcomeUnknown returns cause, described by msg, as the OutcomeUnknownError
// of the append a.
func outcomeUnknown(a *appendArgs, cause error, msg string) error {
	ids := make([]uuid.UUID, len(a.events))
	for i, e := range a.events {
		ids[i] = e.id
	}
	return &OutcomeUnknownError{StreamID: a.stream, EventIDs: ids, err: errors.WrapWithDepth(1, cause, msg)}
}

// answerLost reports whether err, the failure of a statement that may have
// been sent, leaves its outcome unknown: neither was it certainly unsent,
// nor did the server's answer say that it failed.
func answerLost(err error) bool { return !unsent(err) && !answered(err) }

// unsent reports whether err says that the statement was never sent: a
// connection that could not be had, or a request pgconn knows it did not
// send (SafeToRetry).
func unsent(err error) bool {
	var connectErr *pgconn.ConnectError
	return pgconn.SafeToRetry(err) || errors.As(err, &connectErr)
}

// answered reports whether err is the server's answer that the statement
// failed: an ERROR (a *pgconn.PgError, or what translate made of one) rolled
// its transaction back. A FATAL one ends the session, possibly after the
// commit (terminated while waiting for a synchronous standby, say), and
// says nothing.
func answered(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		sev := pgErr.SeverityUnlocalized // Severity is in the server's lc_messages
		if sev == "" {
			sev = pgErr.Severity
		}
		return sev != "FATAL" && sev != "PANIC"
	}
	// translate's errors without the *pgconn.PgError they came from.
	return errors.Is(err, ErrWrongExpectedVersion) || errors.Is(err, ErrInvalidEvent) ||
		errors.Is(err, ErrEventIDConflict) || errors.Is(err, ErrAppendOnly) || errors.Is(err, ErrStreamDeleted)
}

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
	case "42501": // insufficient_privilege
		return errmark.Mark(errors.Wrap(err, ErrNotGranted.Error()), ErrNotGranted)
	case "42P05", "26000": // duplicate_prepared_statement, invalid_sql_statement_name
		// pgx's statement cache on a connection whose server sessions a
		// pooler in transaction mode hands around.
		return errors.Wrap(err, "a pooler in transaction mode without prepared-statement support is between this pool and PostgreSQL: "+
			"use pgx's QueryExecModeCacheDescribe or QueryExecModeExec (default_query_exec_mode in the URL), "+
			"or PgBouncer 1.21 or later with max_prepared_statements; see docs/operations.md, \"PgBouncer and other poolers\"")
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
