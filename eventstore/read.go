package eventstore

import (
	"context"
	"fmt"
	"iter"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/internal/errmark"
)

// ReadAll yields every event with a position of at least from, in position
// (commit) order, fetching a page at a time. Events of types with
// upcasters are yielded upcast to the current schema version (see
// Registry.RegisterUpcaster); an upcast failure ends the iteration with an
// error matching ErrUpcast. Positions may have holes (left
// by rolled-back appends) but never appear out of order: a reader that has
// seen position N has seen every committed event below N.
//
// Each page is read into memory before its events are yielded, so the loop
// body may use the same pool. Stop early by breaking out of the loop.
func (s *Store) ReadAll(ctx context.Context, from int64) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		next := from
		for {
			page, err := s.page(ctx, s.pool, s.q.readAll, next, s.pageSize)
			if err != nil {
				yield(Event{}, errors.Wrap(err, "eventstore: read all"))
				return
			}
			for _, e := range page {
				e, err := s.registry.Upcast(e)
				if err != nil {
					yield(Event{}, err)
					return
				}
				if !yield(e, nil) {
					return
				}
			}
			if len(page) < s.pageSize {
				return
			}
			next = page[len(page)-1].GlobalSequence + 1
		}
	}
}

// ReadStream yields the events of streamID with a version of at least
// fromVersion (versions start at 1), in version order, upcast as ReadAll
// does. A stream with no events yields ErrStreamNotFound; a deleted one
// ErrStreamDeleted (a *StreamDeletedError). Events hidden by the stream's
// truncation (StreamInfo.TruncateBefore: a recreated stream starts after its
// deletion) are not yielded, so the first event may have a version above
// fromVersion. A read that spans several pages (Config.PageSize) reads
// each in a query of its own: when the stream is deleted, recreated or
// truncated past the next version between two of them (by TruncateBefore,
// or by its retention, which is applied as it is read: a max count that
// appends slide, a max age that Config.Clock passes, and a scavenge of
// either), the read ends with ErrStreamChanged instead of yielding a
// prefix, events of the stream before and after the change as one, or
// versions after a gap. ReadStreamTx in a REPEATABLE READ transaction
// reads one snapshot and never sees that (the clock aside: a max age is
// applied at each page's Config.Clock).
func (s *Store) ReadStream(ctx context.Context, streamID string, fromVersion int64) iter.Seq2[Event, error] {
	return s.readStream(ctx, s.pool, streamID, fromVersion)
}

// ReadStreamTx is ReadStream inside tx: it sees tx's own appends, and in a
// REPEATABLE READ transaction, the snapshot of tx. The loop body must not
// use tx while a page is read (pages are read whole before they are
// yielded, so between events it may).
func (s *Store) ReadStreamTx(ctx context.Context, tx pgx.Tx, streamID string, fromVersion int64) iter.Seq2[Event, error] {
	return s.readStream(ctx, tx, streamID, fromVersion)
}

// querier is what reads need of a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Store) readStream(ctx context.Context, db querier, streamID string, fromVersion int64) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		if streamID == "" {
			yield(Event{}, invalidf("stream ID is empty"))
			return
		}
		next := fromVersion
		first := true
		for {
			page, err := s.page(ctx, db, s.q.readStream, next, s.pageSize, streamID)
			if err != nil {
				yield(Event{}, errors.Wrapf(err, "eventstore: read stream %q", streamID))
				return
			}
			if first && len(page) == 0 {
				if _, err := s.streamVersionOf(ctx, db, streamID); err != nil {
					yield(Event{}, err)
				}
				return
			}
			if !first && (len(page) == 0 || page[0].StreamVersion != next) {
				// The previous page was full: a next version was due,
				// unless the stream ends there. An empty page at its end
				// is the only way a read ends on a full page.
				if changed := s.changedWhileRead(ctx, db, streamID, next, page); changed != nil {
					yield(Event{}, changed)
					return
				}
			}
			first = false
			for _, e := range page {
				e, err := s.registry.Upcast(e)
				if err != nil {
					yield(Event{}, err)
					return
				}
				if !yield(e, nil) {
					return
				}
			}
			if len(page) < s.pageSize {
				return
			}
			next = page[len(page)-1].StreamVersion + 1
		}
	}
}

// changedWhileRead says whether a stream read page by page changed between
// the previous page, which was full and ended at version next-1, and page,
// which does not go on at next (see ReadStream): nil when page is empty
// and the stream, still live, ends at next-1 (the read is done); else an
// error matching ErrStreamChanged (and ErrStreamDeleted for a stream
// deleted meanwhile).
func (s *Store) changedWhileRead(ctx context.Context, db querier, streamID string, next int64, page []Event) error {
	v, err := s.streamVersionOf(ctx, db, streamID)
	switch {
	case err == nil && len(page) == 0 && v < next:
		return nil
	case errors.Is(err, ErrStreamDeleted):
		return errmark.Mark(errors.Wrapf(err, "eventstore: read stream %q: deleted after version %d was read; read it again", streamID, next-1), ErrStreamChanged)
	case err != nil && !errors.Is(err, ErrStreamNotFound):
		return errors.Wrapf(err, "eventstore: read stream %q", streamID)
	}
	found := "no event"
	if len(page) > 0 {
		found = fmt.Sprintf("version %d", page[0].StreamVersion)
	}
	return errors.Wrapf(ErrStreamChanged, "eventstore: read stream %q: after version %d, %s (the stream was deleted, recreated or truncated meanwhile); read it again",
		streamID, next-1, found)
}

// StreamVersion returns the current version of streamID, or
// ErrStreamNotFound when it has no events, or a *StreamDeletedError
// (ErrStreamDeleted) when it is deleted.
func (s *Store) StreamVersion(ctx context.Context, streamID string) (int64, error) {
	return s.streamVersionOf(ctx, s.pool, streamID)
}

func (s *Store) streamVersionOf(ctx context.Context, db querier, streamID string) (int64, error) {
	var v int64
	var state int16
	err := db.QueryRow(ctx, s.q.streamVersion, streamID).Scan(&v, &state)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, errors.Wrapf(ErrStreamNotFound, "stream %q", streamID)
	}
	if err == nil && state != 0 {
		return 0, errors.WithStack(&StreamDeletedError{StreamID: streamID, Version: v, Hard: state == 2, read: true})
	}
	return v, errors.Wrapf(err, "eventstore: read version of stream %q", streamID)
}

// page runs one paged read. The stream form takes (stream, from, limit);
// the log form takes (from, limit).
func (s *Store) page(ctx context.Context, db querier, query string, from int64, limit int, stream ...string) ([]Event, error) {
	var rows pgx.Rows
	var err error
	if len(stream) == 1 {
		rows, err = db.Query(ctx, query, stream[0], from, limit, s.clock())
	} else {
		rows, err = db.Query(ctx, query, from, limit)
	}
	if err != nil {
		return nil, err
	}
	return ScanEvents(rows, limit)
}

// ScanEvents reads rows with the columns global_sequence, event_id,
// stream_id, stream_version, event_type, data, metadata, recorded_at (the
// events table's order) into events, closing rows. sizeHint preallocates.
func ScanEvents(rows pgx.Rows, sizeHint int) ([]Event, error) {
	out := make([]Event, 0, sizeHint)
	var e Event
	var meta []byte
	_, err := pgx.ForEachRow(rows, []any{&e.GlobalSequence, &e.ID, &e.StreamID, &e.StreamVersion, &e.Type, &e.Data, &meta, &e.RecordedAt}, func() error {
		ev := e
		if len(meta) > 0 {
			if err := ev.Metadata.UnmarshalJSON(meta); err != nil {
				return errors.Wrapf(err, "event %d", ev.GlobalSequence)
			}
		}
		out = append(out, ev)
		e.Data = nil
		return nil
	})
	return out, err
}
