package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/telemetry"
	"github.com/annals-dev/annals/internal/txopts"
)

// TimerID identifies a timer (a UUIDv7).
type TimerID = uuid.UUID

// Timer is a delayed append: at At, Events are appended to StreamID.
type Timer struct {
	// At is when the timer is due, by the scheduler's Clock. A time in the
	// past (or now) makes the timer due at once: the next dispatcher pass
	// fires it. Required, in the years 1 to 9999 (UTC).
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
	// Owner is an optional tag (package saga uses saga.Owner(name, id), e.g.
	// "saga:5:order:o-17"); CancelOwned cancels every pending timer with it.
	// Like a stream ID: valid UTF-8 without control characters, at most
	// MaxOwnerBytes. Defaults to none.
	Owner string
}

// MaxOwnerBytes is the longest Timer.Owner, in bytes of UTF-8. The owner is
// a key of a B-tree index (timers_owner), whose entries PostgreSQL caps at
// about 2,700 bytes: a longer owner that does not compress failed with
// SQLSTATE 54000. 2048 leaves room, and holds a saga's owner tag for a saga
// name and an instance ID of about 2,000 bytes together.
const MaxOwnerBytes = 2048

// CheckOwner reports whether owner can be a Timer.Owner, as ScheduleTimer
// checks it: nil, or an error matching ErrInvalidTimer that names the rule.
// An owner is checked as eventstore checks a stream ID: valid UTF-8
// (PostgreSQL refuses anything else), no control character (C0, DEL, C1:
// NUL, which PostgreSQL cannot store either, and line breaks, which would
// break the table of `annals schedule list`), at most MaxOwnerBytes. The
// empty owner (none) passes. Code that derives owners from its own IDs (the
// saga package does) can test a candidate with it.
func CheckOwner(owner string) error {
	if len(owner) > MaxOwnerBytes {
		return errors.Wrapf(ErrInvalidTimer, "timer owner %s is %d bytes; the limit is %d", quotePrefix(owner), len(owner), MaxOwnerBytes)
	}
	for i, r := range owner {
		switch {
		case r == utf8.RuneError && invalidAt(owner, i):
			return errors.Wrapf(ErrInvalidTimer, "timer owner %s is not valid UTF-8 at byte %d", quotePrefix(owner), i)
		case r < 0x20 || (r >= 0x7f && r <= 0x9f):
			return errors.Wrapf(ErrInvalidTimer, "timer owner %s contains the control character %U at byte %d", quotePrefix(owner), r, i)
		}
	}
	return nil
}

// invalidAt reports whether s holds a byte that is not UTF-8 at i (where
// ranging over s gave utf8.RuneError, which a U+FFFD written out gives too).
func invalidAt(s string, i int) bool {
	_, size := utf8.DecodeRuneInString(s[i:])
	return size == 1
}

// quotePrefix quotes the first 64 bytes of s (and says if there are more),
// for an error message.
func quotePrefix(s string) string {
	if len(s) <= 64 {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:64]) + "…"
}

// Schedule stores a timer that appends events to streamID (expected version
// Any) when at has come by the scheduler's Clock. A time in the past fires
// at once. With a nil tx the timer is stored in a transaction of its own;
// with a tx it exists only if tx commits (and the dispatchers are woken
// then). The events are validated and encoded now (eventstore.Encode), and
// their IDs fixed, so the append runs exactly these events (and is
// idempotent by event ID): the encoded append is stored byte for byte and
// sent as stored. It is an append in a transaction, as Transact makes, and
// stores each event's data and metadata byte for byte as encoded
// (append_events_json, migration 0035).
//
// Errors match ErrInvalidTimer for bad input, and also the eventstore error
// that eventstore.Encode returned (ErrInvalidEvent, ErrUnknownEventType),
// or an *eventstore.InvalidEventError for a number that jsonb cannot hold
// (beyond the range of PostgreSQL's numeric, such as 1e200000) in metadata,
// or in data holding "$personal" or a \u escape, which the append refuses
// (in other data it is stored as written).
func (s *Scheduler) Schedule(ctx context.Context, tx pgx.Tx, at time.Time, streamID string, events ...eventstore.EventData) (TimerID, error) {
	return s.ScheduleTimer(ctx, tx, Timer{At: at, StreamID: streamID, Events: events})
}

// ScheduleTimer stores t; see Schedule.
func (s *Scheduler) ScheduleTimer(ctx context.Context, tx pgx.Tx, t Timer) (TimerID, error) {
	if t.At.IsZero() {
		return uuid.Nil, errors.Wrapf(ErrInvalidTimer, "timer for stream %q has no due time", t.StreamID)
	}
	if err := CheckOwner(t.Owner); err != nil {
		return uuid.Nil, errors.Wrapf(err, "timer for stream %q", t.StreamID)
	}
	if !storableTime(t.At) {
		return uuid.Nil, errors.Wrapf(ErrInvalidTimer, "timer for stream %q is due at %s: want a time in the years 1 to 9999", t.StreamID, t.At.UTC())
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
		return uuid.Nil, errmark.Mark(errors.Wrap(err, "scheduler: timer"), ErrInvalidTimer)
	}
	if err := s.checkStorable(ctx, tx, enc); err != nil {
		if errors.Is(err, eventstore.ErrInvalidEvent) {
			err = errmark.Mark(errors.Wrap(err, "scheduler: timer"), ErrInvalidTimer)
		}
		return uuid.Nil, err
	}
	payload, err := encodePayload(enc)
	if err != nil {
		return uuid.Nil, err
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

// storableTime reports whether t can be stored as a due time: the years 1
// to 9999 (UTC). pgx encodes a timestamptz in microseconds since 2000 in an
// int64 that silently wraps around for times far from it (a timer due in
// the year 292277026596 was stored as 1969 and fired at once); PostgreSQL
// itself takes 4713 BC to 294276 AD, but no timer needs those, and RFC 3339
// (JSON, `annals schedule list`) stops at 9999.
func storableTime(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 1 && y <= 9999
}

// Cancel deletes a pending (or failed) timer and reports whether it did.
// It reports false for an unknown, cancelled or fired ID. A timer that a
// dispatcher is firing right now is waited for: if its append succeeds, it
// fired and Cancel reports false; if it fails, Cancel deletes the timer
// (true) before the dispatcher can take it again or record the failure, so
// a timer Cancel did not delete has fired. A dispatcher that does not let
// go within Config.ClaimTimeout, or that waits for a lock tx holds (after
// an append in tx), makes Cancel fail with ErrTimerBusy: nothing cancelled,
// tx still usable. With a tx, the cancellation takes effect if tx commits.
//
// Without a tx, a Cancel whose answer was lost (its connection failed, or
// ctx ended, after the DELETE was sent) may have deleted the timer; a
// second Cancel then reports false although the timer never fired. Where
// that matters, cancel in a tx of your own and learn the outcome of its
// commit there, or check the timer's effect (its event in the log) rather
// than Cancel's answer.
func (s *Scheduler) Cancel(ctx context.Context, tx pgx.Tx, id TimerID) (bool, error) {
	n, err := s.cancel(ctx, tx, s.q.cancelTimer, id)
	if err != nil {
		return false, errors.Wrapf(err, "scheduler: cancel timer %s", id)
	}
	return n == 1, nil
}

// CancelOwned cancels every pending (or failed) timer whose Owner is owner,
// as Cancel does (it waits for the timers being fired right now, and fails
// with ErrTimerBusy, cancelling none, as Cancel does), and returns how many
// it deleted. An empty owner, or one that is not valid UTF-8 or holds NUL
// (which PostgreSQL cannot take, nor could have stored), is ErrInvalidTimer;
// any other is looked for, even one ScheduleTimer refuses now: a timer
// stored before it checked owners may have it.
func (s *Scheduler) CancelOwned(ctx context.Context, tx pgx.Tx, owner string) (int, error) {
	if owner == "" {
		return 0, errors.Wrap(ErrInvalidTimer, "CancelOwned with an empty owner")
	}
	if !utf8.ValidString(owner) || strings.IndexByte(owner, 0) >= 0 {
		return 0, errors.Wrapf(ErrInvalidTimer, "CancelOwned: owner %s is not valid UTF-8 or holds NUL, which PostgreSQL cannot store", quotePrefix(owner))
	}
	n, err := s.cancel(ctx, tx, s.q.cancelOwned, owner)
	if err != nil {
		return 0, errors.Wrapf(err, "scheduler: cancel timers of %q", owner)
	}
	return int(n), nil
}

// cancel runs a cancellation (sql with arg) in a transaction of its own, or
// in a savepoint of tx, waiting for held rows at most ClaimTimeout. A wait
// that times out or ends a deadlock (the dispatcher holding the row waits
// for a lock that tx holds) rolls back to the savepoint: ErrTimerBusy, and
// tx goes on.
func (s *Scheduler) cancel(ctx context.Context, tx pgx.Tx, sql string, arg any) (int64, error) {
	var n int64
	run := func(sp pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(s.q.boundCancel, strconv.FormatInt(s.cfg.ClaimTimeout.Milliseconds(), 10))
		b.Queue(sql, arg).Exec(func(tag pgconn.CommandTag) error {
			n = tag.RowsAffected()
			return nil
		})
		b.Queue(s.q.unboundCancel)
		return sp.SendBatch(ctx, b).Close()
	}
	var err error
	if tx != nil {
		err = pgx.BeginFunc(ctx, tx, run)
	} else {
		// READ COMMITTED whatever the server's default: the DELETE that
		// waited for a firing dispatcher then sees its outcome (the row
		// gone: it fired) instead of failing to serialize.
		err = pgx.BeginTxFunc(ctx, s.pool, pgtx.ReadCommitted, run)
	}
	var pgErr *pgconn.PgError
	switch {
	case !errors.As(err, &pgErr):
	case pgErr.Code == "55P03" || pgErr.Code == "40P01": // lock_not_available (the lock_timeout), deadlock_detected
		return 0, errmark.Mark(errors.Wrap(err, "a dispatcher firing it did not let go"), ErrTimerBusy)
	case pgErr.Code == "40001": // serialization_failure: the caller's transaction is REPEATABLE READ or SERIALIZABLE
		return 0, errmark.Mark(errors.Wrap(err, "a dispatcher fired or retried the timer meanwhile, which a REPEATABLE READ or SERIALIZABLE "+
			"transaction cannot see: retry the transaction (the timer's row is rolled back to before the cancel), or cancel in a READ COMMITTED one"), ErrTimerBusy)
	}
	return n, err
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

// claimed is a timer taken by a claim: deleted in the claim's transaction,
// fired if that transaction commits.
type claimed struct {
	id       uuid.UUID
	payload  []byte
	attempts int
	lost     int // consecutive lost races (timers.lost_races)
	dueAt    time.Time
}

// scanArgs returns the destinations of a ClaimDue or ClaimTimer row.
func (c *claimed) scanArgs() []any { return []any{&c.id, &c.payload, &c.attempts, &c.lost, &c.dueAt} }

// sortClaim orders a claim by due time, then ID, as the claim selected it:
// DELETE … RETURNING returns rows in no particular order.
func sortClaim(batch []claimed) {
	slices.SortFunc(batch, func(a, b claimed) int {
		if c := a.dueAt.Compare(b.dueAt); c != 0 {
			return c
		}
		return bytes.Compare(a.id[:], b.id[:]) // PostgreSQL's uuid order
	})
}

// decode returns the timer's encoded append; a payload that is not one is a
// permanent failure (eventstore.ErrInvalidEvent).
func (c *claimed) decode() (eventstore.EncodedAppend, error) {
	var enc eventstore.EncodedAppend
	if err := json.Unmarshal(c.payload, &enc); err != nil {
		return enc, errors.Wrap(eventstore.ErrInvalidEvent, "the timer's payload is not an encoded append: "+err.Error())
	}
	return enc, nil
}

// appendFailed reports whether err is the database's answer to an append
// (a wrong expected version, a conflict, any statement error), as opposed to
// a lost or terminated session (a FATAL error) or an ended context, after
// which firing again now is pointless.
func appendFailed(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Severity == "ERROR"
	}
	return errors.Is(err, eventstore.ErrWrongExpectedVersion) ||
		errors.Is(err, eventstore.ErrInvalidEvent) || errors.Is(err, eventstore.ErrEventIDConflict) ||
		errors.Is(err, eventstore.ErrUnknownEventType) || errors.Is(err, eventstore.ErrAppendOnly)
}

// boundedClaim sends a claim transaction's first statement, sql with args
// (read by the callback read sets on it), together with BoundClaim in one
// round trip: from then on the transaction may sit idle at most ClaimTimeout
// on the server.
func (s *Scheduler) boundedClaim(ctx context.Context, tx pgx.Tx, read func(*pgx.QueuedQuery), sql string, args ...any) error {
	b := &pgx.Batch{}
	b.Queue(s.q.boundClaim, strconv.FormatInt(s.cfg.ClaimTimeout.Milliseconds(), 10))
	read(b.Queue(sql, args...))
	return tx.SendBatch(ctx, b).Close()
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

// claimBatch claims up to BatchSize due timers and fires them in one
// transaction (eventstore.Store.Transact): first the claim, one DELETE …
// RETURNING of the due rows it can lock, which takes no append lock; then
// every timer's append and the COMMIT, sent together in one round trip, so
// the log's ordering lock is held only for the server-side time of the
// appends and the commit. The appends run in due order.
//
// If an append fails (or a payload does not decode), the transaction rolls
// back and the claimed timers are fired one by one instead (fireOne), so
// that a failing timer does not hold back the others.
func (s *Scheduler) claimBatch(ctx context.Context, now time.Time) (claimedN, fired int, err error) {
	var batch []claimed
	staged, undecodable := false, false
	_, err = s.store.Transact(claimContext(ctx), func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		err := s.boundedClaim(ctx, tx, func(q *pgx.QueuedQuery) {
			q.Query(func(rows pgx.Rows) error {
				var c claimed
				_, err := pgx.ForEachRow(rows, c.scanArgs(), func() error {
					batch = append(batch, claimed{c.id, append([]byte(nil), c.payload...), c.attempts, c.lost, c.dueAt})
					return nil
				})
				return err
			})
		}, s.q.claimDue, now, s.cfg.BatchSize)
		if err != nil {
			return errors.Wrap(err, "scheduler: claim due timers")
		}
		if len(batch) == 0 {
			return nil
		}
		sortClaim(batch)
		if s.afterClaim != nil {
			s.afterClaim(tx)
		}
		for i := range batch {
			enc, err := batch[i].decode()
			if err == nil {
				err = b.AppendEncoded(enc)
			}
			if err != nil {
				undecodable = true
				return err
			}
		}
		staged = true
		return nil
	})
	switch {
	case err == nil:
		s.fired.Add(int64(len(batch)))
		return len(batch), len(batch), nil
	case !staged && !undecodable:
		return len(batch), 0, err // the claim itself failed: nothing was taken
	case ctx.Err() != nil || (!undecodable && !appendFailed(err)):
		return len(batch), 0, errors.Wrap(err, "scheduler: fire timers")
	}
	for _, c := range batch {
		ok, err := s.fireOne(ctx, now, c.id)
		if err != nil {
			return len(batch), fired, err
		}
		if ok {
			fired++
		}
	}
	return len(batch), fired, nil
}

// fireOne fires one timer, if it is still due and no other dispatcher holds
// it, in a transaction of its own shaped like a claim: delete the row, then
// send its append and the COMMIT in one round trip. If the append fails,
// the failure is recorded (fail): the timer is retried later or, its
// attempts spent or the error permanent, kept as failed.
func (s *Scheduler) fireOne(ctx context.Context, now time.Time, id uuid.UUID) (bool, error) {
	var c claimed
	found, staged := false, false
	var ferr error // why the timer could not be staged
	_, err := s.store.Transact(claimContext(ctx), func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		err := s.boundedClaim(ctx, tx, func(q *pgx.QueuedQuery) {
			q.QueryRow(func(row pgx.Row) error { return row.Scan(c.scanArgs()...) })
		}, s.q.claimTimer, id, now)
		if err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // fired, cancelled or held by someone else meanwhile
			}
			return errors.Wrapf(err, "scheduler: claim timer %s", id)
		}
		found = true
		if s.afterClaim != nil {
			s.afterClaim(tx)
		}
		enc, err := c.decode()
		if err == nil {
			err = b.AppendEncoded(enc)
		}
		if err != nil {
			ferr = err
			return err
		}
		staged = true
		return nil
	})
	switch {
	case err == nil:
		if found {
			s.fired.Add(1)
		}
		return found, nil
	case !found:
		return false, err
	case staged && (ctx.Err() != nil || !appendFailed(err)):
		// The connection or the context is gone: nothing is recorded.
		return false, errors.Wrapf(err, "scheduler: fire timer %s", id)
	case staged:
		ferr = err
	}
	return false, s.fail(ctx, now, c, ferr)
}

// claimContext returns ctx for the Transact of a claim of timers:
// READ COMMITTED (readCommitted), and telemetry only when the claim appends
// or fails (internal/txopts.QuietWhenEmpty): a pass that finds no timer due
// is no append, and recorded one per PollInterval in every process.
func claimContext(ctx context.Context) context.Context {
	return txopts.QuietWhenEmpty(readCommitted(ctx))
}

// readCommitted returns ctx asking Transact for a READ COMMITTED
// transaction (internal/txopts), whatever the server's or the role's
// default_transaction_isolation. Under REPEATABLE READ or SERIALIZABLE a
// claim fails to serialize (40001) when another append changed its stream
// after the claim's snapshot was taken, or another dispatcher deleted a row
// it skips; each such failure cost a timer an attempt, and with MaxAttempts
// 1 valid timers ended failed. Cancel runs READ COMMITTED for the same
// reason.
func readCommitted(ctx context.Context) context.Context {
	return txopts.With(ctx, pgtx.ReadCommitted)
}

// transient reports whether err is a serialization failure (40001) or a
// deadlock (40P01): the transaction lost a race, which says nothing about
// the timer, and trying again will do.
func transient(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// lostRacesPerAttempt is how many consecutive lost races (serialization
// failures, deadlocks) of a timer count as one attempt: the last of them
// does.
const lostRacesPerAttempt = 10

// maxLostRaces returns how many lost races in a row count as an attempt:
// lostRacesPerAttempt times MaxAttempts, so that only a timer that keeps
// losing far longer than a failing one retries ends failed for it.
func (s *Scheduler) maxLostRaces() int {
	if s.cfg.MaxAttempts > math.MaxInt32/lostRacesPerAttempt {
		return math.MaxInt32 // lost_races is an integer column
	}
	return lostRacesPerAttempt * s.cfg.MaxAttempts
}

// fail records a failed attempt to fire c: it is retried after a backoff,
// or kept as failed when its attempts are spent or ferr is permanent. A
// transient ferr (a serialization failure, a deadlock) is a lost race, not
// an attempt: the timer's attempts stay as they are and it is retried after
// RetryBackoff, doubled for each race lost in a row up to MaxRetryBackoff
// (timers.lost_races). The maxLostRaces-th race lost in a row counts as an
// attempt (and resets the count), so that a timer that never wins ends
// failed rather than being retried forever. Any other failure resets the
// count. The update is skipped if the timer changed meanwhile (another
// dispatcher fired it or recorded this attempt's failure).
func (s *Scheduler) fail(ctx context.Context, now time.Time, c claimed, ferr error) error {
	attempt := c.attempts + 1
	var retryAt, failedAt *time.Time
	permanent := errors.Is(ferr, eventstore.ErrInvalidEvent) || errors.Is(ferr, eventstore.ErrEventIDConflict) ||
		errors.Is(ferr, eventstore.ErrUnknownEventType)
	counted, lost := 1, 0
	lastError, streak := ferr.Error(), 0 // streak: races lost in a row, when they count
	if transient(ferr) && c.lost+1 >= s.maxLostRaces() {
		streak = c.lost + 1
		lastError = strconv.Itoa(streak) + " serialization failures or deadlocks in a row, counted as an attempt; the last: " + lastError
	}
	switch {
	case transient(ferr) && c.lost+1 < s.maxLostRaces():
		attempt, counted, lost = c.attempts, 0, c.lost+1
		r := now.Add(s.backoff(lost))
		retryAt = &r
	case permanent || attempt >= s.cfg.MaxAttempts:
		failedAt = &now
	default:
		r := now.Add(s.backoff(attempt))
		retryAt = &r
	}
	tag, err := s.pool.Exec(ctx, s.q.failTimer, c.id, lastError, retryAt, failedAt, c.attempts, counted, lost, c.lost)
	if err != nil {
		return errors.Wrapf(err, "scheduler: record failure of timer %s", c.id)
	}
	if tag.RowsAffected() == 0 {
		return nil
	}
	if counted == 0 {
		s.cfg.Logger.WarnContext(ctx, "annals: timer's append lost a race (serialization failure or deadlock); retrying later, not counted as an attempt",
			"timer", c.id, "attempts", attempt, "lost_races", lost, "retry_at", *retryAt, telemetry.Err(ferr))
		return nil
	}
	if failedAt != nil {
		s.cfg.Logger.ErrorContext(ctx, "annals: timer failed; it is kept and no longer retried",
			"timer", c.id, "attempts", attempt, "permanent", permanent, "lost_races", streak, telemetry.Err(ferr))
	} else {
		s.cfg.Logger.WarnContext(ctx, "annals: timer failed; retrying later",
			"timer", c.id, "attempts", attempt, "lost_races", streak, "retry_at", *retryAt, telemetry.Err(ferr))
	}
	return nil
}

// backoff returns the delay before attempt+1 after attempt failed ones.
func (s *Scheduler) backoff(attempt int) time.Duration {
	d := s.cfg.RetryBackoff
	for i := 1; i < attempt && d < s.cfg.MaxRetryBackoff; i++ {
		if d > s.cfg.MaxRetryBackoff/2 {
			d = s.cfg.MaxRetryBackoff // doubling could overflow
			break
		}
		d *= 2
	}
	return min(d, s.cfg.MaxRetryBackoff)
}
