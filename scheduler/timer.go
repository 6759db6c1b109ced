package scheduler

import (
	"context"
	"encoding/json"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
)

// TimerID identifies a timer (a UUIDv7).
type TimerID = uuid.UUID

// Timer is a delayed append: at At, Events are appended to StreamID.
type Timer struct {
	// At is when the timer is due, by the scheduler's Clock. A time in the
	// past (or now) makes the timer due at once: the next dispatcher pass
	// fires it. Required.
	At time.Time
	// StreamID is the stream the events are appended to. Required.
	StreamID string
	// Expected is the expected version the append checks when it runs.
	// The zero value means eventstore.Any (not NoStream, whose value is
	// zero too; set ExpectNoStream for that). Defaults to Any.
	Expected eventstore.ExpectedVersion
	// ExpectNoStream makes the append require that the stream does not exist
	// when the timer fires (eventstore.NoStream). Expected must then be zero.
	ExpectNoStream bool
	// Events are the events to append, at least one. They are validated and
	// encoded (IDs fixed) when the timer is scheduled.
	Events []eventstore.EventData
	// Owner is an optional tag, e.g. "saga:order:o-17"; CancelOwned cancels
	// every pending timer with it. Defaults to none.
	Owner string
}

// Schedule stores a timer that appends events to streamID (expected version
// Any) when at has come by the scheduler's Clock. A time in the past fires
// at once. With a nil tx the timer is stored in a transaction of its own;
// with a tx it exists only if tx commits (and the dispatchers are woken
// then). The events are validated and their IDs fixed now, so the append
// runs exactly these events (and is idempotent by event ID).
//
// Errors match ErrInvalidTimer for bad input, and also the eventstore error
// that eventstore.Encode returned (ErrInvalidEvent, ErrUnknownEventType).
func (s *Scheduler) Schedule(ctx context.Context, tx pgx.Tx, at time.Time, streamID string, events ...eventstore.EventData) (TimerID, error) {
	return s.ScheduleTimer(ctx, tx, Timer{At: at, StreamID: streamID, Events: events})
}

// ScheduleTimer stores t; see Schedule.
func (s *Scheduler) ScheduleTimer(ctx context.Context, tx pgx.Tx, t Timer) (TimerID, error) {
	if t.At.IsZero() {
		return uuid.Nil, errors.Wrapf(ErrInvalidTimer, "timer for stream %q has no due time", t.StreamID)
	}
	expected := t.Expected
	switch {
	case t.ExpectNoStream && expected != 0:
		return uuid.Nil, errors.Wrapf(ErrInvalidTimer, "timer for stream %q sets both ExpectNoStream and Expected (%s)", t.StreamID, expected)
	case t.ExpectNoStream:
		expected = eventstore.NoStream
	case expected == 0:
		expected = eventstore.Any
	}
	enc, err := s.store.Encode(ctx, t.StreamID, expected, t.Events...)
	if err != nil {
		return uuid.Nil, errors.Mark(errors.Wrap(err, "scheduler: timer"), ErrInvalidTimer)
	}
	payload, err := json.Marshal(enc)
	if err != nil {
		return uuid.Nil, errors.Wrap(err, "scheduler: encode timer")
	}
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.Nil, errors.Wrap(err, "scheduler: timer ID")
	}
	var owner *string
	if t.Owner != "" {
		owner = &t.Owner
	}
	if _, err := s.db(tx).Exec(ctx, s.q.insertTimer, id, t.At, t.StreamID, payload, owner, s.channel, id.String()); err != nil {
		return uuid.Nil, errors.Wrapf(err, "scheduler: store timer for stream %q", t.StreamID)
	}
	s.signal()
	return id, nil
}

// Cancel deletes a pending (or failed) timer and reports whether it did.
// It reports false for an unknown or already fired ID, and for a timer that
// a dispatcher is firing right now (that timer fires): Cancel never waits
// for a dispatcher, so it cannot deadlock with one that holds the timer and
// waits for the log's append lock held by the caller's transaction. With a
// tx, the cancellation takes effect if tx commits.
func (s *Scheduler) Cancel(ctx context.Context, tx pgx.Tx, id TimerID) (bool, error) {
	tag, err := s.db(tx).Exec(ctx, s.q.cancelTimer, id)
	if err != nil {
		return false, errors.Wrapf(err, "scheduler: cancel timer %s", id)
	}
	return tag.RowsAffected() == 1, nil
}

// CancelOwned cancels every pending (or failed) timer whose Owner is owner,
// as Cancel does (timers being fired right now are skipped), and returns how
// many it deleted.
func (s *Scheduler) CancelOwned(ctx context.Context, tx pgx.Tx, owner string) (int, error) {
	if owner == "" {
		return 0, errors.Wrap(ErrInvalidTimer, "CancelOwned with an empty owner")
	}
	tag, err := s.db(tx).Exec(ctx, s.q.cancelOwned, owner)
	if err != nil {
		return 0, errors.Wrapf(err, "scheduler: cancel timers of %q", owner)
	}
	return int(tag.RowsAffected()), nil
}

// TimerInfo describes a stored timer.
type TimerInfo struct {
	// ID is the timer's ID.
	ID TimerID
	// DueAt is when it is (next) due; a failed attempt pushes it back.
	DueAt time.Time
	// StreamID is the stream its events go to.
	StreamID string
	// Owner is its owner tag, or "".
	Owner string
	// Events is the number of events it appends; EventType the first one's type.
	Events    int
	EventType string
	// Attempts counts failed attempts to fire it; LastError is the last one's error.
	Attempts  int
	LastError string
	// FailedAt is set when its attempts are spent: it is kept but not retried.
	FailedAt *time.Time
	// CreatedAt is when it was stored (database clock).
	CreatedAt time.Time
}

// Failed reports whether the timer's attempts are spent.
func (t TimerInfo) Failed() bool { return t.FailedAt != nil }

// Timers lists up to limit stored timers (1 to 1000): failed ones first,
// then pending ones by due time.
func (s *Scheduler) Timers(ctx context.Context, limit int) ([]TimerInfo, error) {
	if limit < 1 || limit > 1000 {
		return nil, errors.Wrapf(ErrInvalidTimer, "Timers limit %d: want 1 to 1000", limit)
	}
	rows, err := s.pool.Query(ctx, s.q.listTimers, limit)
	if err != nil {
		return nil, errors.Wrap(err, "scheduler: list timers")
	}
	var out []TimerInfo
	var t TimerInfo
	var owner *string
	_, err = pgx.ForEachRow(rows, []any{&t.ID, &t.DueAt, &t.StreamID, &owner, &t.Attempts, &t.LastError, &t.FailedAt, &t.CreatedAt, &t.Events, &t.EventType}, func() error {
		t.Owner = ""
		if owner != nil {
			t.Owner = *owner
		}
		out = append(out, t)
		return nil
	})
	return out, errors.Wrap(err, "scheduler: list timers")
}

// TimerStats counts the stored timers.
type TimerStats struct {
	// Pending timers may still fire; Failed ones have spent their attempts.
	Pending, Failed int
	// NextDue is the earliest due time of a pending timer (nil: none).
	NextDue *time.Time
}

// TimerStats returns counts of pending and failed timers and the next due time.
func (s *Scheduler) TimerStats(ctx context.Context) (TimerStats, error) {
	var st TimerStats
	err := s.pool.QueryRow(ctx, s.q.timerStats).Scan(&st.Pending, &st.Failed, &st.NextDue)
	return st, errors.Wrap(err, "scheduler: timer stats")
}

type claimed struct {
	id       uuid.UUID
	payload  []byte
	attempts int
}

// fireTimers fires every timer due at now, a batch per transaction.
func (s *Scheduler) fireTimers(ctx context.Context, now time.Time) (int, error) {
	total := 0
	for {
		n, fired, err := s.claimBatch(ctx, now)
		total += fired
		if err != nil || n < s.cfg.BatchSize {
			return total, err
		}
	}
}

// claimBatch claims up to BatchSize due timers, deleting them and appending
// their events in one transaction. If any append fails, the transaction is
// rolled back and the batch is fired one timer at a time instead, each in a
// savepoint, so that a failing timer does not hold back the others.
func (s *Scheduler) claimBatch(ctx context.Context, now time.Time) (claimedN, fired int, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, 0, errors.Wrap(err, "scheduler: begin claim")
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after commit
	rows, err := tx.Query(ctx, s.q.claimDue, now, s.cfg.BatchSize)
	if err != nil {
		return 0, 0, errors.Wrap(err, "scheduler: claim due timers")
	}
	var batch []claimed
	var c claimed
	if _, err := pgx.ForEachRow(rows, []any{&c.id, &c.payload, &c.attempts}, func() error {
		batch = append(batch, claimed{c.id, append([]byte(nil), c.payload...), c.attempts})
		return nil
	}); err != nil {
		return 0, 0, errors.Wrap(err, "scheduler: claim due timers")
	}
	if len(batch) == 0 {
		return 0, 0, nil
	}
	if s.afterClaim != nil {
		s.afterClaim(tx)
	}
	ok := true
	for _, c := range batch {
		var enc eventstore.EncodedAppend
		if json.Unmarshal(c.payload, &enc) != nil {
			ok = false
			break
		}
		if _, err := s.store.AppendEncodedTx(ctx, tx, enc); err != nil {
			if ctx.Err() != nil {
				return len(batch), 0, errors.Wrap(err, "scheduler: fire timers")
			}
			ok = false
			break
		}
	}
	if ok {
		if err := tx.Commit(ctx); err != nil {
			return len(batch), 0, errors.Wrap(err, "scheduler: commit fired timers")
		}
		s.fired.Add(int64(len(batch)))
		return len(batch), len(batch), nil
	}
	if err := tx.Rollback(ctx); err != nil {
		return len(batch), 0, errors.Wrap(err, "scheduler: roll back failed batch")
	}
	ids := make([]uuid.UUID, len(batch))
	for i, c := range batch {
		ids[i] = c.id
	}
	fired, err = s.fireOneByOne(ctx, now, ids)
	return len(batch), fired, err
}

// fireOneByOne fires the given timers (those still due and not held by
// another dispatcher), each in a savepoint; a failing one records the
// failure and is retried later or, its attempts spent, kept as failed.
func (s *Scheduler) fireOneByOne(ctx context.Context, now time.Time, ids []uuid.UUID) (int, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, errors.Wrap(err, "scheduler: begin claim")
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, s.q.lockTimers, ids, now)
	if err != nil {
		return 0, errors.Wrap(err, "scheduler: lock timers")
	}
	var batch []claimed
	var c claimed
	if _, err := pgx.ForEachRow(rows, []any{&c.id, &c.payload, &c.attempts}, func() error {
		batch = append(batch, claimed{c.id, append([]byte(nil), c.payload...), c.attempts})
		return nil
	}); err != nil {
		return 0, errors.Wrap(err, "scheduler: lock timers")
	}
	fired := 0
	for _, c := range batch {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return 0, errors.Wrap(err, "scheduler: savepoint")
		}
		var enc eventstore.EncodedAppend
		ferr := json.Unmarshal(c.payload, &enc)
		if ferr != nil {
			ferr = errors.Wrap(eventstore.ErrInvalidEvent, "the timer's payload is not an encoded append: "+ferr.Error())
		} else if _, ferr = s.store.AppendEncodedTx(ctx, sp, enc); ferr == nil {
			if _, ferr = sp.Exec(ctx, s.q.deleteTimer, c.id); ferr == nil {
				if err := sp.Commit(ctx); err != nil {
					return 0, errors.Wrap(err, "scheduler: release savepoint")
				}
				fired++
				continue
			}
		}
		if err := sp.Rollback(ctx); err != nil {
			// The connection or the context is gone: nothing is recorded.
			return 0, errors.Wrapf(errors.CombineErrors(ferr, err), "scheduler: fire timer %s", c.id)
		}
		attempt := c.attempts + 1
		var retryAt, failedAt *time.Time
		permanent := errors.Is(ferr, eventstore.ErrInvalidEvent) || errors.Is(ferr, eventstore.ErrEventIDConflict) ||
			errors.Is(ferr, eventstore.ErrUnknownEventType)
		if permanent || attempt >= s.cfg.MaxAttempts {
			failedAt = &now
		} else {
			r := now.Add(s.backoff(attempt))
			retryAt = &r
		}
		if _, err := tx.Exec(ctx, s.q.failTimer, c.id, ferr.Error(), retryAt, failedAt); err != nil {
			return 0, errors.Wrapf(err, "scheduler: record failure of timer %s", c.id)
		}
		if failedAt != nil {
			s.cfg.Logger.ErrorContext(ctx, "annals: timer failed; it is kept and no longer retried",
				"timer", c.id, "attempts", attempt, "permanent", permanent, "error", ferr)
		} else {
			s.cfg.Logger.WarnContext(ctx, "annals: timer failed; retrying later",
				"timer", c.id, "attempts", attempt, "retry_at", *retryAt, "error", ferr)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, errors.Wrap(err, "scheduler: commit fired timers")
	}
	s.fired.Add(int64(fired))
	return fired, nil
}

// backoff returns the delay before attempt+1 after attempt failed ones.
func (s *Scheduler) backoff(attempt int) time.Duration {
	d := s.cfg.RetryBackoff
	for i := 1; i < attempt && d < s.cfg.MaxRetryBackoff; i++ {
		d *= 2
	}
	return min(d, s.cfg.MaxRetryBackoff)
}
