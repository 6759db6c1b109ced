package eventstore

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/internal/sqltmpl"
)

//go:embed lifecycle.sql
var lifecycleSQL string

// Reserved event types. Types starting with ReservedTypePrefix are written
// only by annals (DeleteStream); an append that names one fails with
// ErrInvalidEvent. Register the Go types below (RegisterLifecycleEvents) for
// typed handlers to receive them.
const (
	// ReservedTypePrefix starts every event type annals reserves.
	ReservedTypePrefix = "$stream."
	// StreamDeletedType is the type of the event DeleteStream appends; its
	// data decodes into StreamDeleted.
	StreamDeletedType = "$stream.deleted"
	// StreamTruncatedType is the type of the event SetStreamRetention
	// appends to the stream's metadata stream (MetadataStream), and
	// DeleteStream too since migration 0038 (with StreamTruncated.Deleted
	// set); its data decodes into StreamTruncated.
	StreamTruncatedType = "$stream.truncated"
)

// MetadataStream returns the stream that receives streamID's
// StreamTruncatedType events: "$$" + streamID. (They do not go to the
// stream itself, whose versions and aggregates they would disturb.)
func MetadataStream(streamID string) string { return metadataStreamPrefix + streamID }

// metadataStreamPrefix starts every metadata stream's ID (MetadataStream).
const metadataStreamPrefix = "$$"

// StreamTruncated is the data of a StreamTruncatedType event: a stream's
// retention after a change. From then on its events below TruncateBefore,
// beyond MaxCount or older than MaxAgeSeconds are hidden from stream reads
// and removed from the log by the scavenger (subscribers that had not
// processed them yet never will). SetStreamRetention writes it for a
// retention change (Deleted empty); since migration 0038 DeleteStream
// writes it for a deletion too (Deleted and Version set), after the
// stream's StreamDeletedType event and in its transaction.
type StreamTruncated struct {
	// StreamID is the stream whose retention changed.
	StreamID string `json:"stream_id"`
	// TruncateBefore is the first version stream reads return.
	TruncateBefore int64 `json:"truncate_before"`
	// MaxAgeSeconds is the maximum age of its events (nil: none).
	MaxAgeSeconds *float64 `json:"max_age_seconds"`
	// MaxCount is how many of its newest events are kept (nil: all).
	MaxCount *int64 `json:"max_count"`
	// Deleted is "soft" or "hard" when the record is of a deletion
	// (DeleteStream, since migration 0038), and empty when it is of a
	// retention change (SetStreamRetention).
	Deleted string `json:"deleted,omitempty"`
	// Version is, for a deletion, the version of the stream's
	// StreamDeletedType event (TruncateBefore is just above it); 0 for a
	// retention change.
	Version int64 `json:"version,omitempty"`
}

// StreamDeleted is the data of a StreamDeletedType event: the last event
// of a deleted stream (or of its life before it was recreated).
type StreamDeleted struct {
	// Hard is true for a hard delete: the stream takes no appends, ever.
	Hard bool `json:"hard"`
}

// RegisterLifecycleEvents registers the Go types of annals' reserved
// events (StreamDeleted, StreamTruncated) in r, so that Registry.Decode,
// Decode and typed handlers (projection.On, saga handlers) can receive them.
func RegisterLifecycleEvents(r *Registry) error {
	return errors.CombineErrors(Register[StreamDeleted](r, StreamDeletedType),
		Register[StreamTruncated](r, StreamTruncatedType))
}

func reservedType(name string) bool { return strings.HasPrefix(name, ReservedTypePrefix) }

var (
	// ErrStreamDeleted is matched (errors.Is) by reads of a deleted stream and
	// by appends to a deleted stream that do not recreate it, and also by
	// everything done to a hard-deleted stream. errors.As with
	// *StreamDeletedError reads its version.
	ErrStreamDeleted = errors.New("stream deleted")

	// ErrStreamTombstoned is matched by a *StreamDeletedError of a
	// hard-deleted stream: it can never be appended to again.
	ErrStreamTombstoned = errors.New("stream hard-deleted")
)

// StreamDeletedError reports a deleted stream. It matches ErrStreamDeleted,
// and ErrStreamTombstoned when Hard.
type StreamDeletedError struct {
	// StreamID is the stream.
	StreamID string
	// Version is the stream's version: that of its deletion event. An
	// append with Exact(Version) recreates a stream that is not Hard.
	Version int64
	// Hard reports a hard delete (a tombstone).
	Hard bool

	read bool // a read met it: the message says what that means for a read
}

func (e *StreamDeletedError) Error() string {
	switch {
	case e.read && e.Hard:
		return fmt.Sprintf("stream %q is hard-deleted (version %d): it has nothing to read, and never will", e.StreamID, e.Version)
	case e.read:
		return fmt.Sprintf("stream %q is deleted (version %d): it has nothing to read until an append expecting exactly version %d recreates it",
			e.StreamID, e.Version, e.Version)
	case e.Hard:
		return fmt.Sprintf("stream %q is hard-deleted (version %d): it can never be appended to again", e.StreamID, e.Version)
	}
	return fmt.Sprintf("stream %q is deleted (version %d); an append expecting exactly version %d recreates it",
		e.StreamID, e.Version, e.Version)
}

// Is makes errors.Is match ErrStreamDeleted, and ErrStreamTombstoned when Hard.
func (e *StreamDeletedError) Is(target error) bool {
	return target == ErrStreamDeleted || (target == ErrStreamTombstoned && e.Hard)
}

// streamDeletedFromSQL turns AN005/AN006 into a *StreamDeletedError.
func streamDeletedFromSQL(pgErr *pgconn.PgError, streamID string) error {
	d := struct {
		StreamID string `json:"stream_id"`
		Version  int64  `json:"version"`
	}{StreamID: streamID}
	if err := json.Unmarshal([]byte(pgErr.Detail), &d); err != nil {
		return errors.Wrapf(pgErr, "annals: cannot read the stream from %q", pgErr.Detail)
	}
	return errors.WithStack(&StreamDeletedError{StreamID: d.StreamID, Version: d.Version, Hard: pgErr.Code == CodeStreamTombstoned})
}

// StreamState is the life-cycle state of a stream.
type StreamState int16

const (
	// StreamLive: the stream takes appends and reads.
	StreamLive StreamState = 0
	// StreamSoftDeleted: reads fail with ErrStreamDeleted; an append
	// expecting exactly its version recreates it.
	StreamSoftDeleted StreamState = 1
	// StreamHardDeleted: a tombstone; nothing can be appended, ever.
	StreamHardDeleted StreamState = 2
)

func (s StreamState) String() string {
	switch s {
	case StreamLive:
		return "live"
	case StreamSoftDeleted:
		return "deleted"
	case StreamHardDeleted:
		return "hard-deleted"
	}
	return fmt.Sprintf("StreamState(%d)", int16(s))
}

// StreamInfo describes a stream's row: its version, life-cycle state and
// the first version reads return.
type StreamInfo struct {
	// StreamID is the stream.
	StreamID string
	// Version is the version of its last event.
	Version int64
	// State is live, deleted or hard-deleted.
	State StreamState
	// TruncateBefore is the first version reads return (0 or 1: all).
	// Deleting sets it past the deletion event, so that a recreated stream
	// reads from its first new event.
	TruncateBefore int64
	// CreatedAt and UpdatedAt are when the stream was first and last appended to.
	CreatedAt, UpdatedAt time.Time
	// Retention is the stream's maximum age and count (zero: none).
	Retention
}

// Retention limits which of a stream's events are kept. Stream reads
// honour it at once; the scavenger removes the hidden rows later.
type Retention struct {
	// MaxAge hides events recorded longer ago than this (by the Store's
	// Clock for reads, the scavenger's for removal). 0: no limit. Stored with
	// microsecond precision.
	MaxAge time.Duration
	// MaxCount keeps only the newest MaxCount versions. 0: no limit.
	MaxCount int64
}

// RetentionChange is what SetStreamRetention changes; nil fields are left
// as they are.
type RetentionChange struct {
	// MaxAge sets the maximum age (0: no limit); at most MaxRetentionAge:
	// a longer one is refused (ErrInvalidEvent).
	MaxAge *time.Duration
	// MaxCount sets the maximum count (0: no limit).
	MaxCount *int64
	// TruncateBefore raises the first version stream reads return (at most
	// version + 1, which hides every event so far; a higher value is taken
	// as version + 1). It can only grow: since migration 0040 a value below
	// the current one (0 and 1 count as the same, every version) is refused
	// with an *InvalidEventError of Field "truncate_before", whose Limit is
	// the current one; before 0040 it was ignored.
	TruncateBefore *int64
}

// RetentionResult is what SetStreamRetention returns: the stream's info
// after the call, and whether the call changed anything.
type RetentionResult struct {
	StreamInfo
	// Unchanged reports a call that set only what was set already (and
	// whose settings the latest StreamTruncatedType record already holds):
	// nothing was changed and no record was appended. Since migration 0040;
	// on an older schema every call appends a record and Unchanged is false.
	Unchanged bool
	// Position is the global position of the StreamTruncatedType record the
	// call appended to MetadataStream(streamID); 0 when Unchanged.
	Position int64
}

// MaxRetentionAge is the longest RetentionChange.MaxAge: 292 years of
// 365.25 days, as set_stream_retention bounds it (migration 0032), so that
// no age subtracted from a date leaves PostgreSQL's range.
const MaxRetentionAge = 292 * 8766 * time.Hour

// DeleteOptions configures DeleteStream. A nil *DeleteOptions means a soft
// delete with no metadata.
type DeleteOptions struct {
	// Hard makes the delete a tombstone: the stream can never be appended
	// to again (ErrStreamTombstoned). Defaults to false: a soft delete,
	// undone by an append that expects exactly the stream's version.
	Hard bool
	// Metadata is stored on the deletion event (e.g. who asked and why).
	Metadata Metadata
}

type lifecycleQueries struct {
	deleteStream, streamInfo, setRetention string
}

func newLifecycleQueries(schema string) (lifecycleQueries, error) {
	named, err := sqltmpl.Named("lifecycle.sql", lifecycleSQL, sqltmpl.NewData(schema))
	if err != nil {
		return lifecycleQueries{}, err
	}
	return lifecycleQueries{deleteStream: named["DeleteStream"], streamInfo: named["StreamInfo"],
		setRetention: named["SetStreamRetention"]}, nil
}

// DeleteStream deletes streamID by appending one StreamDeletedType event to
// it (projections and sagas see it like any event) and marking it deleted,
// in one transaction of its own. expected is as for Append, except that
// NoStream is refused (the stream must exist: deleting a stream with no
// events fails with a *WrongExpectedVersionError matching ErrStreamNotFound).
//
// After a soft delete, reads of the stream fail with ErrStreamDeleted until
// an append with Exact(version of the deletion event) recreates it; its
// versions then continue, and reads start after the deletion event. After a
// hard delete every append fails with ErrStreamTombstoned. Deleting a
// deleted stream again fails with ErrStreamDeleted, unless the new delete
// is hard. The events stay in the log (ReadAll and subscriptions see them)
// until the scavenger removes them. A metadata stream (MetadataStream, "$$"
// and a stream ID) cannot be deleted: the call fails with an
// *InvalidEventError (field stream_id).
func (s *Store) DeleteStream(ctx context.Context, streamID string, expected ExpectedVersion, opts *DeleteOptions) (AppendResult, error) {
	return s.deleteStream(ctx, s.pool, streamID, expected, opts)
}

// DeleteStreamTx is DeleteStream inside tx. Like AppendTx it takes the
// log's ordering lock until tx ends: make it the last statement of tx.
func (s *Store) DeleteStreamTx(ctx context.Context, tx pgx.Tx, streamID string, expected ExpectedVersion, opts *DeleteOptions) (AppendResult, error) {
	return s.deleteStream(ctx, tx, streamID, expected, opts)
}

func (s *Store) deleteStream(ctx context.Context, q querier, streamID string, expected ExpectedVersion, opts *DeleteOptions) (res AppendResult, err error) {
	ctx, done := s.trace(ctx, "annals.delete_stream", streamID, expected, 1)
	defer func() { done(res, err) }()
	var o DeleteOptions
	if opts != nil {
		o = *opts
	}
	if err := checkName(0, "stream_id", streamID, MaxStreamIDBytes); err != nil {
		return AppendResult{}, err
	}
	if strings.HasPrefix(streamID, metadataStreamPrefix) {
		return AppendResult{}, &InvalidEventError{Field: "stream_id",
			Reason: "is a metadata stream, kept by annals (SetStreamRetention appends to it); delete the stream it describes instead"}
	}
	if expected == NoStream {
		return AppendResult{}, &InvalidEventError{Field: "expected_version", Reason: "is NoStream; a delete needs a stream"}
	}
	exp, err := expected.sqlArg()
	if err != nil {
		return AppendResult{}, err
	}
	if err := checkMetadata(1, o.Metadata); err != nil {
		return AppendResult{}, err
	}
	var meta []byte
	if md := withTraceContext(traceContext(ctx), o.Metadata); !md.IsZero() {
		if meta, err = json.Marshal(md); err != nil {
			return AppendResult{}, invalidf("delete of stream %q: metadata: %v", streamID, err)
		}
		if why := checkJSONText(meta, true); why != "" { // delete_stream takes jsonb
			return AppendResult{}, &InvalidEventError{Event: 1, Field: "metadata", Reason: why}
		}
	}
	var metaArg any // NULL, not a JSON null, without metadata
	if meta != nil {
		metaArg = string(meta)
	}
	rows, err := q.Query(ctx, s.lc.deleteStream, streamID, exp, o.Hard, metaArg)
	return collectAppend(rows, err, appendArgs{stream: streamID, exp: expected, count: 1})
}

// StreamInfo returns streamID's row, deleted or not: version, state and
// truncation. A stream with no events returns ErrStreamNotFound.
func (s *Store) StreamInfo(ctx context.Context, streamID string) (StreamInfo, error) {
	info := StreamInfo{StreamID: streamID}
	var state int16
	var maxAge, maxCount *int64
	err := s.pool.QueryRow(ctx, s.lc.streamInfo, streamID).Scan(&info.Version, &state, &info.TruncateBefore, &info.CreatedAt, &info.UpdatedAt,
		&maxAge, &maxCount)
	if errors.Is(err, pgx.ErrNoRows) {
		return StreamInfo{}, errors.Wrapf(ErrStreamNotFound, "stream %q", streamID)
	}
	if err != nil {
		return StreamInfo{}, errors.Wrapf(err, "eventstore: read stream %q", streamID)
	}
	info.State = StreamState(state)
	info.Retention = retention(maxAge, maxCount)
	return info, nil
}

func retention(maxAgeMicros, maxCount *int64) Retention {
	var r Retention
	if maxAgeMicros != nil {
		r.MaxAge = time.Duration(*maxAgeMicros) * time.Microsecond
	}
	if maxCount != nil {
		r.MaxCount = *maxCount
	}
	return r
}

// SetStreamRetention changes streamID's retention (see RetentionChange) and
// appends a StreamTruncatedType event with the result to
// MetadataStream(streamID), in one transaction. Stream reads honour the new
// settings at once; ReadAll and subscriptions still see the hidden events
// until the scavenger removes them. It waits for a scavenge step in
// progress, so a step never removes what the change keeps. Returns the
// stream's info afterwards. A call that changes nothing appends no event
// and returns Unchanged (since migration 0040). A stream with no events
// returns ErrStreamNotFound; negative values, a MaxAge over
// MaxRetentionAge and (since migration 0040) a TruncateBefore below the
// current one, an *InvalidEventError (ErrInvalidEvent). Every stream ID an
// append takes is taken; a schema before migration 0041 refuses one of 511
// or 512 bytes (the function held its metadata stream's ID, 2 bytes
// longer, to MaxStreamIDBytes), with an *InvalidEventError.
func (s *Store) SetStreamRetention(ctx context.Context, streamID string, c RetentionChange) (RetentionResult, error) {
	if err := checkName(0, "stream_id", streamID, MaxStreamIDBytes); err != nil {
		return RetentionResult{}, err
	}
	var age, count, before any
	if c.MaxAge != nil {
		if *c.MaxAge < 0 {
			return RetentionResult{}, &InvalidEventError{Field: "max_age", Reason: "is negative"}
		}
		if *c.MaxAge > 0 && *c.MaxAge < time.Microsecond {
			return RetentionResult{}, &InvalidEventError{Field: "max_age", Reason: "is below a microsecond"}
		}
		if *c.MaxAge > MaxRetentionAge {
			return RetentionResult{}, &InvalidEventError{Field: "max_age", Reason: "is over 292 years"}
		}
		age = c.MaxAge.Microseconds()
	}
	if c.MaxCount != nil {
		if *c.MaxCount < 0 {
			return RetentionResult{}, &InvalidEventError{Field: "max_count", Reason: "is negative"}
		}
		count = *c.MaxCount
	}
	if c.TruncateBefore != nil {
		if *c.TruncateBefore < 0 {
			return RetentionResult{}, &InvalidEventError{Field: "truncate_before", Reason: "is negative"}
		}
		before = *c.TruncateBefore
	}
	var tb, seq int64
	var maxAge, maxCount *int64
	var recorded bool
	err := s.pool.QueryRow(ctx, s.lc.setRetention, streamID, age, count, before).Scan(&tb, &maxAge, &maxCount, &seq, &recorded)
	if err != nil {
		err = translate(err, streamID, StreamExists)
		if errors.Is(err, ErrStreamNotFound) {
			return RetentionResult{}, errors.Wrapf(ErrStreamNotFound, "stream %q", streamID)
		}
		var inv *InvalidEventError
		if errors.As(err, &inv) && inv.Field == "truncate_before" && c.TruncateBefore != nil {
			inv.Reason = fmt.Sprintf("is %d, below stream %q's current %d: it can only grow", *c.TruncateBefore, streamID, inv.Limit)
			inv.sqlMessage = false
		}
		return RetentionResult{}, errors.Wrapf(err, "eventstore: set retention of stream %q", streamID)
	}
	info, err := s.StreamInfo(ctx, streamID)
	if err != nil {
		return RetentionResult{}, err
	}
	return RetentionResult{StreamInfo: info, Unchanged: !recorded, Position: seq}, nil
}
