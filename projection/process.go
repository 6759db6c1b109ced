package projection

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/metric"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/telemetry"
)

// failures is the failure handling both processors share: recording
// attempts, waiting between retries, dead-lettering, parking and stopping.
type failures struct {
	name   string
	q      map[string]string
	retry  RetryPolicy
	policy DeadLetterPolicy
	// timeout is the HandlerTimeout; 0 means none (see unboundedTimeout).
	timeout time.Duration
	// idle is the idle limit (idleLimit) of a transaction on the lease's
	// connection, and every how often a batch whose handlers send nothing
	// pings it (a third of FreezeTimeout; both 0: none). setup is the
	// statement that sets the limit, and begin the BEGIN that sets it too
	// (one simple-protocol string); both "" when there is none.
	// redeliveryBegin is the BEGIN of an observer's re-delivery, whose
	// handler runs while the transaction holds the dead letter's lock: the
	// idle limit, or the handler timeout and redeliverySlack if shorter.
	idle, every                   time.Duration
	setup, begin, redeliveryBegin string
	clock                         Clock
	hooks                         Hooks
	logger                        *slog.Logger
	tel                           *telemetry.Subscription
	childSpans                    bool
	// eventSpans: a span and a duration record per handler call
	// (Config.HandlerSpans); otherwise per batch only.
	eventSpans bool
	// The handler context shared by consecutive calls (handlerContext).
	hctx    context.Context
	hcancel context.CancelFunc
	hparent context.Context
	// hdeadline is hctx's deadline as time since hbase (monotonic).
	hbase     time.Time
	hdeadline time.Duration
	// registry upcasts events before they reach the handler (nil: none).
	registry *eventstore.Registry
	// attempts of events being retried, by this leader or (inherit) the
	// earlier ones: their rows are deleted once the event is handled, and
	// the count is a span attribute.
	attempts map[uuid.UUID]int
	// Metric attribute sets, built once rather than per event.
	subAttrs, okAttrs, errAttrs metric.MeasurementOption
}

// parked maps a parked stream to its state: whether it still has an open
// (unreleased) dead letter — its later events are dead-lettered "open" then,
// or "retry" (queued behind the released ones) — and the position of its
// first unresolved dead letter: only events after it are parked.
type parked map[string]parkState

type parkState struct {
	open  bool
	first int64
}

func (s parked) status(stream string) string {
	if s[stream].open {
		return "open"
	}
	return "retry"
}

// holds reports whether e is parked behind an earlier dead letter.
func (s parked) holds(e eventstore.Event) bool {
	st, ok := s[e.StreamID]
	return ok && e.GlobalSequence > st.first
}

// loadParked returns the parked streams among the events' streams.
func (f *failures) loadParked(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (parked, error) {
	p := parked{}
	if f.policy == SkipEvent || b.Unresolved == 0 || len(b.Events) == 0 {
		return p, nil
	}
	seen := map[string]bool{}
	var streams []string
	for _, e := range b.Events {
		if !seen[e.StreamID] {
			seen[e.StreamID] = true
			streams = append(streams, e.StreamID)
		}
	}
	err := lease.Do(ctx, func(conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, f.q["ParkedStreams"], lease.Subscriber, lease.Partition, streams)
		if err != nil {
			return err
		}
		var s string
		var st parkState
		_, err = pgx.ForEachRow(rows, []any{&s, &st.open, &st.first}, func() error { p[s] = st; return nil })
		return err
	})
	return p, errors.Wrap(err, "projection: read parked streams")
}

// inherit starts a leadership: the failed attempts of the events still
// ahead of the checkpoint become the attempts being tracked, whoever made
// them, so that forget deletes them when the event is handled (rows left
// behind by earlier leaders, at or below the checkpoint, are deleted). It
// is best effort, like an observer's forget: rows it misses only cost
// space until the next leadership, and the attempt count comes from the
// table anyway.
func (f *failures) inherit(ctx context.Context, lease *catchup.Lease) {
	clear(f.attempts)
	if lease.Ephemeral() {
		return
	}
	err := lease.Do(ctx, func(conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, f.q["InheritFailures"], lease.Subscriber, lease.Partition, lease.Start)
		if err != nil {
			return err
		}
		var id uuid.UUID
		var attempt int
		_, err = pgx.ForEachRow(rows, []any{&id, &attempt}, func() error { f.attempts[id] = attempt; return nil })
		return err
	})
	if err != nil {
		f.logger.WarnContext(ctx, "annals: reading the failed attempts of earlier leaders failed",
			slog.String("subscriber", f.name), slog.Int("partition", lease.Partition), telemetry.Err(err))
	}
}

// retried reports whether e has failed attempts recorded, by this leader or
// an earlier one (inherit), that forget should delete once it succeeds.
func (f *failures) retried(e eventstore.Event) bool {
	_, ok := f.attempts[e.ID]
	return ok
}

// forget deletes the failed attempts of an event that has now succeeded, in
// db: for a projection, the transaction that applies it, so they go exactly
// when it is applied. Kept, they would count against the event if it is
// read again after a rewind, and the table would grow forever. The attempts
// of dead-lettered events stay with their dead letter (dlq purge deletes
// both).
func (f *failures) forget(ctx context.Context, db checkpoint.DB, e eventstore.Event) error {
	_, err := db.Exec(ctx, f.q["ForgetFailures"], f.name, e.ID)
	return errors.Wrap(err, "projection: delete the failed attempts of a handled event")
}

// forgotten drops e from the attempts being tracked, after forget committed.
func (f *failures) forgotten(e eventstore.Event) { delete(f.attempts, e.ID) }

// storable makes an error text storable in a PostgreSQL text column (valid
// UTF-8, no NUL bytes) and at most max bytes long, so that no error can make
// its own recording fail.
func storable(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", `\x00`)
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "") + " …(truncated)"
	}
	return s
}

func errorText(err error) string { return storable(err.Error(), 8<<10) }

// recordFailure writes the attempt's failures row on the lock's connection
// (outside any rolled-back transaction) and returns the attempt number. It
// is fenced by the lease's epoch: a fenced leader records nothing and gets
// checkpoint.ErrFenced, which ends its leadership (the engine releases the
// lock and stands by) instead of spending its retry budget while a rebuild
// or an operator waits for the lock.
func (f *failures) recordFailure(ctx context.Context, lease *catchup.Lease, e eventstore.Event, cause error) (int, error) {
	var attempt int
	err := lease.Do(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, f.q["RecordFailure"], lease.Subscriber, lease.Partition, e.ID, e.GlobalSequence,
			errorText(cause), lease.Epoch).Scan(&attempt)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, f.fenced(lease, "record a failed attempt")
	}
	return attempt, errors.Wrap(err, "projection: record a failed attempt")
}

// noteRetryAt records when the attempt's retry is due, for the operator
// console. It is information only: a failure to write it is logged, never
// returned (the wait and the retry do not depend on it).
func (f *failures) noteRetryAt(ctx context.Context, lease *catchup.Lease, e eventstore.Event, attempt int, d time.Duration) {
	err := lease.Do(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, f.q["RetryAt"], lease.Subscriber, e.ID, attempt, d.Microseconds())
		return err
	})
	if err != nil {
		f.logger.DebugContext(ctx, "annals: recording when a failed event is retried failed",
			slog.String("subscriber", f.name), telemetry.Err(err))
	}
}

func (f *failures) fenced(lease *catchup.Lease, doing string) error {
	return errors.Wrapf(checkpoint.ErrFenced, "projection: %s of %s/%d: the checkpoint's epoch is no longer %d",
		doing, lease.Subscriber, lease.Partition, lease.Epoch)
}

// fenceCheckInterval is how often a leader waiting out a retry delay checks
// that it still leads (one indexed read of its checkpoint row), so that a
// rebuild or an operator's checkpoint set that fences it gets its lock
// within about this long rather than after the delay, which can be minutes.
const fenceCheckInterval = time.Second

// checkEpoch returns checkpoint.ErrFenced if the lease's epoch is no longer
// the checkpoint's, and an advisorylock.ErrLost error if the lock is lost.
// Any other error is nil: the check is an early exit, the fenced writes
// (RecordFailure, the checkpoint commit) are the guarantee.
func (f *failures) checkEpoch(ctx context.Context, lease *catchup.Lease) error {
	var epoch int64
	err := lease.Do(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, f.q["Epoch"], lease.Subscriber, lease.Partition).Scan(&epoch)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows) || (err == nil && epoch != lease.Epoch):
		return f.fenced(lease, "wait to retry an event")
	case errors.Is(err, advisorylock.ErrLost) || errors.Is(err, advisorylock.ErrReleased):
		return err
	case err != nil:
		f.logger.DebugContext(ctx, "annals: checking the epoch while waiting to retry failed",
			slog.String("subscriber", f.name), telemetry.Err(err))
	}
	return nil
}

// deadLetter writes the dead-letter row (and, under Stop, the stop reason) in
// db, which for projections is the transaction that also moves the checkpoint.
func (f *failures) deadLetter(ctx context.Context, db checkpoint.DB, lease *catchup.Lease, e eventstore.Event, reason, status string, cause error) error {
	lease.Changed() // the next read's dead-letter counts change
	_, err := db.Exec(ctx, f.q["DeadLetter"], lease.Subscriber, lease.Partition, e.ID, e.GlobalSequence,
		e.StreamID, e.Type, reason, errorText(cause), errorDetail(cause), status)
	if err != nil {
		return errors.Wrap(err, "projection: write a dead letter")
	}
	if reason == "failed" && f.policy == Stop {
		return f.stop(ctx, db, lease, "event "+e.ID.String()+" failed: "+errorText(cause))
	}
	return nil
}

// stop halts the partition; fenced when the lease's epoch has moved on.
func (f *failures) stop(ctx context.Context, db checkpoint.DB, lease *catchup.Lease, reason string) error {
	lease.Changed() // the next read's stop reason changes
	tag, err := db.Exec(ctx, f.q["Stop"], lease.Subscriber, lease.Partition, lease.Epoch, storable(reason, 8<<10))
	if err != nil {
		return errors.Wrap(err, "projection: stop the subscriber")
	}
	if tag.RowsAffected() != 1 {
		return errors.Wrapf(checkpoint.ErrFenced, "projection: stop %s/%d at epoch %d", lease.Subscriber, lease.Partition, lease.Epoch)
	}
	return nil
}

func (f *failures) parkedError(e eventstore.Event) error {
	return errors.Newf("stream %q is parked for %q behind an earlier dead letter", e.StreamID, f.name)
}

// afterFailure records a failed attempt and either waits out the retry delay
// (retry: true) or reports that the event must be dead-lettered: the caller
// writes the dead letter, and once it has committed calls deadLettered (the
// hook and the metric count dead letters, not attempts to write one).
func (f *failures) afterFailure(ctx context.Context, lease *catchup.Lease, e eventstore.Event, cause error) (retry bool, err error) {
	attempt, err := f.recordFailure(ctx, lease, e, cause)
	if err != nil {
		return false, err
	}
	if spent(f.retry, attempt, cause) {
		f.logger.WarnContext(ctx, "annals: dead-lettering an event",
			slog.String("subscriber", f.name), slog.Int64("position", e.GlobalSequence),
			slog.String("stream", e.StreamID), slog.Int("attempts", attempt), telemetry.Err(cause))
		return false, nil
	}
	f.retrying(ctx, e, attempt, cause)
	d := f.retry.Delay(attempt)
	f.noteRetryAt(ctx, lease, e, attempt, d)
	f.logger.InfoContext(ctx, "annals: handler failed; retrying",
		slog.String("subscriber", f.name), slog.Int64("position", e.GlobalSequence),
		slog.Int("attempt", attempt), slog.Duration("delay", d), telemetry.Err(cause))
	// The wait (on Clock) also checks the epoch every fenceCheckInterval of
	// real time, and once more before the retry: a fenced leader lets go of
	// its lock within about a second, and does not run (for an observer,
	// repeat the side effects of) another attempt.
	retryAt := f.clock.After(d)
	tick := time.NewTicker(fenceCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-retryAt:
			if err := f.checkEpoch(ctx, lease); err != nil {
				return false, err
			}
			return true, nil
		case <-tick.C:
			if err := f.checkEpoch(ctx, lease); err != nil {
				return false, err
			}
		case <-lease.Stopping():
			return false, errStopping
		case <-lease.Lost():
			return false, errors.Wrap(advisorylock.ErrLost, "projection: lock lost while waiting to retry")
		}
	}
}

// combine returns a and b as one error (either may be nil). errors.Is sees
// only the primary error of a combination, and the engine releases the lock
// on a fenced or lost lease (catchup's isFatal), so whichever of the two says
// so comes first; otherwise a does.
func combine(a, b error) error {
	fatal := func(err error) bool {
		return errors.Is(err, checkpoint.ErrFenced) || errors.Is(err, advisorylock.ErrLost) || errors.Is(err, advisorylock.ErrReleased) ||
			errors.Is(err, catchup.ErrEndLeadership)
	}
	if !fatal(a) && fatal(b) {
		a, b = b, a
	}
	return errors.CombineErrors(a, b)
}

// errStopping ends a batch early at shutdown: the attempt count is stored,
// the next leader continues it.
var errStopping = errors.New("projection: shutting down")

// txProcessor runs a Projection: each batch in one transaction on the lock's
// connection, with the fenced checkpoint update.
type txProcessor struct {
	p   Projection
	f   *failures
	cut CommitCutter // p's, or nil
}

func (t *txProcessor) Start(ctx context.Context, lease *catchup.Lease) error {
	t.f.inherit(ctx, lease)
	return nil
}

func (t *txProcessor) Idle(context.Context, *catchup.Lease) error { return nil }
func (t *txProcessor) End(context.Context, *catchup.Lease) error  { return nil }

// handledThrough counts the events of b at or before position done.
func handledThrough(b catchup.Batch, done int64) int {
	return sort.Search(len(b.Events), func(i int) bool { return b.Events[i].GlobalSequence > done })
}

func (t *txProcessor) Process(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (done int64, err error) {
	ctx, end := t.f.batchTelemetry(ctx, lease, b)
	defer func() {
		t.f.releaseContext()
		end(handledThrough(b, done), err)
	}()
	return t.process(ctx, lease, b)
}

func (t *txProcessor) process(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (int64, error) {
	park, err := t.f.loadParked(ctx, lease, b)
	if err != nil {
		return b.After, err
	}
	cursor, events := b.After, b.Events
	// failing >= 0: events[failing] failed (failed says how), and the events
	// before it commit on their own first, so that the failing event is
	// retried alone and its batch-mates are applied once.
	failing, failed := -1, error(nil)
	// suspects > 0: a transaction of the first suspects events failed after
	// every handler had returned nil (at its commit, say, on a deferred
	// constraint), and the event to blame is being narrowed down (see
	// blameable).
	suspects := 0
	for {
		if failing == 0 {
			e := events[0]
			retry, ferr := t.f.afterFailure(ctx, lease, e, failed)
			switch {
			case errors.Is(ferr, errStopping):
				return cursor, nil
			case ferr != nil:
				return cursor, ferr
			case retry:
				failing, failed = -1, nil
				continue
			}
			// Spent: the dead letter and the checkpoint move commit together.
			err := t.inTx(ctx, lease, func(tx pgx.Tx) error {
				if err := t.f.deadLetter(ctx, tx, lease, e, "failed", "open", failed); err != nil {
					return err
				}
				return lease.Commit(ctx, tx, e.GlobalSequence)
			})
			if err != nil {
				return cursor, err
			}
			t.f.deadLettered(ctx, e, "failed", failed)
			cursor, events, failing, failed = e.GlobalSequence, events[1:], -1, nil
			switch t.f.policy {
			case Stop:
				return cursor, nil // the next read sees the stop reason
			case ParkStream:
				if _, ok := park[e.StreamID]; !ok {
					park[e.StreamID] = parkState{open: true, first: e.GlobalSequence}
				}
			}
			continue
		}
		// The events to apply in this transaction: all of them (the fast
		// path), those before a failing one, or the first half of the
		// suspects.
		n := len(events)
		switch {
		case failing > 0:
			n = failing
		case suspects > 0:
			n = max(1, suspects/2)
		}
		through := b.Through
		if n < len(events) {
			through = events[n-1].GlobalSequence
		}
		failedAt, cutAt, err := t.apply(ctx, lease, events[:n], park, through)
		switch {
		case err == nil:
			if cutAt < 0 && n == len(events) {
				return b.Through, nil
			}
			// Committed through events[k-1]: all n, or early (see CommitCutter).
			k := n
			if cutAt >= 0 {
				k = cutAt + 1
			}
			cursor, events = events[k-1].GlobalSequence, events[k:]
			if failing > 0 {
				failing -= k
			}
			suspects = max(0, suspects-k)
		case failedAt >= 0:
			failing, failed, suspects = failedAt, err, 0
		case blameable(ctx, err):
			if n == 1 {
				// The event's own transaction fails: its failure, like a
				// handler's, is recorded, retried and dead-lettered.
				failing, failed, suspects = 0, eventFailure(t.p.Name(), events[0], err, true), 0
				continue
			}
			t.f.logger.DebugContext(ctx, "annals: a transaction failed after its handlers returned; narrowing down the event to blame",
				slog.String("subscriber", t.f.name), slog.Int64("after", cursor), slog.Int("events", n), telemetry.Err(err))
			failing, failed, suspects = -1, nil, n
		case failed != nil:
			// err (fenced, lock lost, database down) decides what the engine
			// does next.
			return cursor, combine(err, failed)
		default:
			return cursor, err
		}
	}
}

// blameable reports whether err, which failed a transaction of events after
// every handler had returned nil (at its commit, or in the fenced
// checkpoint statement sent with it), is PostgreSQL's answer about what
// one of the transaction's events did, which retrying the batch as it is
// cannot fix. Such a batch is narrowed down (process): its events are
// applied in smaller transactions, halving the failing one, until one
// event's own transaction fails, and that is the event's failure,
// recorded, retried and dead-lettered like a handler's (the events before
// it commit normally, each transaction with its fenced checkpoint move, so
// each is still applied exactly once).
//
// It is an allow-list of what a single event's writes can cause there:
// integrity constraint violations (class 23, a deferred constraint checked
// at COMMIT), data exceptions (class 22) and raise_exception (P0001) from
// deferred constraint triggers, and "current transaction is aborted"
// (25P02) because a handler ignored the error of a failed statement.
//
// Everything else is not blamed on an event, and is returned to the engine,
// which retries the batch after RetryBackoff as for any error besides a
// handler's: no answer from the server (the connection failed or was
// closed, the context ended), a fenced or lost lease (checkpoint.ErrFenced
// has no PostgreSQL error in its chain), and the server's answers about
// itself or the runner rather than an event, such as a permission denied on
// the checkpoint (42501), an idle-in-transaction timeout (25P03), a
// connection exception (class 08), a cancel or shutdown (57), a lack of
// resources (53), and serialization failures and deadlocks (40001, 40P01),
// which are transient: the batch is retried as it is.
func blameable(ctx context.Context, err error) bool {
	var pgErr *pgconn.PgError
	if ctx.Err() != nil || !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23": // data_exception, integrity_constraint_violation
		return true
	}
	switch pgErr.Code {
	case "25P02", "P0001": // in_failed_sql_transaction, raise_exception
		return true
	}
	return false
}

// connLost reports whether err, returned by a handler running in tx, came
// from tx's connection failing under it (the server ended the session, the
// network failed, the pool's connection was closed) rather than from what
// the handler did with the event: the transaction went with the session,
// so nothing of it was applied, and the batch is retried as after any
// database outage (the engine's RetryBackoff) instead of counting an
// attempt against the event, which could dead-letter it and park its
// stream for an outage. A handler that ran out of its timeout is still to
// blame, although pgx closes the connection of a query whose context ends.
func connLost(ctx context.Context, tx pgx.Tx, err error) bool {
	return ctx.Err() == nil && tx.Conn().IsClosed() && !errors.Is(err, errHandlerTimedOut)
}

// eventFailure is err, the failure of projection name's transaction for e,
// with the event named and explained (see explain).
func eventFailure(name string, e eventstore.Event, err error, atCommit bool) error {
	return errors.Wrapf(explain(err, atCommit), "projection %q: event %d (%s, stream %s v%d)", name, e.GlobalSequence, e.Type, e.StreamID, e.StreamVersion)
}

// explain returns err, the error of an event's handler or (atCommit) of its
// transaction, which could not commit although the handler returned nil,
// with what happened said in front. When PostgreSQL had aborted the
// transaction (25P02: every statement after a failed one fails, and so
// does the commit), it says that the handler ignored the error of an
// earlier statement: the error it returned, if any, is not the first one.
func explain(err error, atCommit bool) error {
	var pgErr *pgconn.PgError
	aborted := errors.As(err, &pgErr) && pgErr.Code == "25P02" // in_failed_sql_transaction
	switch {
	case atCommit && aborted:
		return errors.Wrap(err, "its handler returned nil after one of its SQL statements had failed (it ignored the statement's error, "+
			"and PostgreSQL aborts a transaction at its first failed statement), so its transaction could not commit")
	case atCommit:
		return errors.Wrap(err, "its handler returned nil, but its transaction could not commit")
	case aborted:
		return errors.Wrap(err, "an earlier SQL statement of its handler had failed and the handler ignored its error "+
			"(PostgreSQL aborts a transaction at its first failed statement)")
	}
	return err
}

// inBatchTx runs fn in the batch's transaction on the lease's connection
// (a batchTx: BEGIN is sent with the first statement) and commits it
// together with the fenced checkpoint move to the position fn returns, in
// one round trip (Lease.CommitConn): a batch whose handlers write nothing
// costs one round trip, one that writes costs one more than its own
// statements. Anything that fails rolls it back.
//
// On a lease with a lock of its own (a rebuild's or a blue/green
// cut-over's TakeOver), whose batches run on the lock's connection, BEGIN
// is sent first, in a round trip of its own: that session has
// idle_session_timeout (advisorylock.Config.FreezeTimeout), nothing pings
// it while the batch runs, and handlers that worked that long before the
// batch's first statement (a call to another service, within their
// HandlerTimeout) would leave it idle outside a transaction, so the server
// would end it and the lock would be lost. Idle in the transaction, it is
// ended only after the transaction's idle limit (idleLimit: the handler
// timeout plus FreezeTimeout), which BEGIN sets, as on every batch. (A
// lease on the engine's lock session runs its batches on a pool
// connection, which has no idle_session_timeout.)
func (t *txProcessor) inBatchTx(ctx context.Context, lease *catchup.Lease, fn func(tx *batchTx) (int64, error)) error {
	return lease.Do(ctx, func(conn *pgx.Conn) (err error) {
		tx := &batchTx{ctx: ctx, conn: conn, setup: t.f.setup, beginQuery: t.f.begin, idle: t.f.idle, every: t.f.every}
		if tx.every > 0 {
			tx.base = time.Now()
		}
		defer func() {
			if err != nil {
				tx.rollback(ctx)
			}
		}()
		if lease.Lock != nil {
			if err := tx.begin(ctx); err != nil {
				return err
			}
		}
		pos, err := fn(tx)
		if err != nil {
			return err
		}
		begin := !tx.begun
		tx.begun = true // if the commit fails, the transaction may be open
		if err := lease.CommitConn(ctx, conn, begin, pos); err != nil {
			return err
		}
		tx.ended = true
		return nil
	})
}

func (t *txProcessor) inTx(ctx context.Context, lease *catchup.Lease, fn func(tx pgx.Tx) error) error {
	return lease.Do(ctx, func(conn *pgx.Conn) error { return t.f.beginFunc(ctx, conn, fn) })
}

// apply runs events in one transaction with the checkpoint at through;
// events of parked streams become dead letters instead. On a handler error
// it returns the index of the failing event (-1 for any other error). When
// the projection is a CommitCutter that asks for a commit after events[i]
// (not the last), the transaction commits there, with the checkpoint at
// events[i], and apply returns cutAt i; otherwise cutAt is -1.
func (t *txProcessor) apply(ctx context.Context, lease *catchup.Lease, events []eventstore.Event, park parked, through int64) (failedAt, cutAt int, err error) {
	failedAt, cutAt = -1, -1
	var parkedNow, forgotten []eventstore.Event
	err = t.inBatchTx(ctx, lease, func(tx *batchTx) (int64, error) {
		parkedNow, forgotten, cutAt = parkedNow[:0], forgotten[:0], -1
		handle := func(ctx context.Context, e eventstore.Event) error { return t.p.Handle(ctx, tx, e) }
		for i, e := range events {
			if park.holds(e) {
				if err := t.f.deadLetter(ctx, tx, lease, e, "parked", park.status(e.StreamID), t.f.parkedError(e)); err != nil {
					return 0, err
				}
				parkedNow = append(parkedNow, e)
				continue
			}
			// The transaction's idle limit is per gap between statements:
			// handlers that send nothing, one after another, must not add
			// up to it (batchTx).
			if err := tx.keepAlive(ctx); err != nil {
				return 0, errors.Wrapf(err, "projection %q: keep the batch's transaction from idling", t.p.Name())
			}
			err := t.f.deliver(ctx, e, handle)
			if err == nil && tx.overran() {
				err = errmark.Mark(errors.Newf("its handler returned after the batch's transaction had sent nothing for %s: "+
					"past its HandlerTimeout (%s), ignoring its context, and near the transaction's idle limit (%s, HandlerTimeout plus the lock's FreezeTimeout), "+
					"after which the server ends the session", tx.idleFor().Round(time.Millisecond), t.f.timeout, tx.idle), errHandlerTimedOut)
			}
			if err != nil && connLost(ctx, tx, err) {
				return 0, errors.Wrapf(err, "projection %q: event %d: the connection failed under its handler (the event is not to blame)",
					t.p.Name(), e.GlobalSequence)
			}
			if err != nil {
				failedAt = i
				return 0, eventFailure(t.p.Name(), e, err, false)
			}
			if t.f.retried(e) {
				if err := t.f.forget(ctx, tx, e); err != nil {
					return 0, err
				}
				forgotten = append(forgotten, e)
			}
			if t.cut != nil && i < len(events)-1 && t.cut.CommitAfter(e) {
				cutAt = i
				return e.GlobalSequence, nil
			}
		}
		return through, nil
	})
	if err == nil {
		for _, e := range parkedNow {
			t.f.deadLettered(ctx, e, "parked", t.f.parkedError(e))
		}
		for _, e := range forgotten {
			t.f.forgotten(e)
		}
	}
	return failedAt, cutAt, err
}

// Redeliver re-delivers released dead letters in position order, each in a
// transaction that also resolves it, holding its row lock from the start
// (lockRedelivery). A failure reopens it and the released entries behind it
// in its stream, which stays parked.
func (t *txProcessor) Redeliver(ctx context.Context, lease *catchup.Lease) error {
	defer t.f.releaseContext()
	return redeliver(ctx, t.f, lease, func(e eventstore.Event, id int64) error {
		handled := false
		err := t.inTx(ctx, lease, func(tx pgx.Tx) error {
			// Fenced like every write: a no-op checkpoint move checks the
			// epoch. It locks the checkpoint row before the dead letter's,
			// in the order an operator's checkpoint move takes them
			// (checkpoint.Store.Move), so the two cannot deadlock.
			if err := lease.Commit(ctx, tx, 0); err != nil {
				return err
			}
			if ok, err := lockRedelivery(ctx, tx, t.f, id); err != nil || !ok {
				return err
			}
			err := t.f.deliver(ctx, e, func(ctx context.Context, e eventstore.Event) error { return t.p.Handle(ctx, tx, e) })
			if err != nil && connLost(ctx, tx, err) {
				return errors.Wrapf(err, "projection %q: re-delivering event %d: the connection failed under its handler (the event is not to blame)",
					t.p.Name(), e.GlobalSequence)
			}
			if err != nil {
				return handlerError{explain(err, false)}
			}
			handled = true
			return resolve(ctx, tx, t.f, id)
		})
		var he handlerError
		if handled && !errors.As(err, &he) && blameable(ctx, err) {
			// The transaction of the event alone failed after its handler
			// returned (a deferred constraint at commit): the event's failure.
			return handlerError{explain(err, true)}
		}
		return err
	})
}

// lockRedelivery locks dead letter id in tx, the transaction of its
// re-delivery, which then resolves it, and reports whether it is still to
// be delivered: an operator may have skipped it (or purged it) since it
// was read, and then nothing is delivered (logged at debug level). Held
// until tx ends, the lock makes an operator's Skip of the entry wait for
// the re-delivery, which it then finds resolved: without it, a Skip
// while an observer's handler ran succeeded, and the entry stayed
// "skipped" (resolved without delivery) although its event was delivered.
// An observer's re-delivery, whose handler runs while tx waits, begins tx
// with a tighter idle limit (failures.redeliveryBegin), so that a handler
// that ignores its context and overruns cannot hold the lock for longer:
// the server ends the session, the transaction rolls back, and the entry
// is delivered again later.
func lockRedelivery(ctx context.Context, tx pgx.Tx, f *failures, id int64) (bool, error) {
	var status string
	err := tx.QueryRow(ctx, f.q["LockRedelivery"], id).Scan(&status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		status = "gone"
	case err != nil:
		return false, errors.Wrapf(err, "projection: lock dead letter %d for its re-delivery", id)
	}
	if status != "retry" {
		f.logger.DebugContext(ctx, "annals: a released dead letter was settled by someone else before its re-delivery",
			slog.String("subscriber", f.name), slog.Int64("dead_letter", id), slog.String("status", status))
		return false, nil
	}
	return true, nil
}

// redeliverySlack is how much longer than the handler timeout an observer's
// re-delivery transaction may wait for its handler (see lockRedelivery),
// unless the idle limit is shorter still.
const redeliverySlack = 5 * time.Second

// resolve marks a re-delivered dead letter resolved; if it is no longer
// marked for retry (which the lock taken by lockRedelivery rules out), the
// delivery's transaction rolls back.
func resolve(ctx context.Context, db checkpoint.DB, f *failures, id int64) error {
	tag, err := db.Exec(ctx, f.q["Resolve"], id)
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.Newf("projection: dead letter %d was no longer marked for retry", id)
	}
	return err
}

// handlerError marks a re-delivery failure as the handler's (not the database's).
type handlerError struct{ error }

func (h handlerError) Unwrap() error { return h.error }

func redeliver(ctx context.Context, f *failures, lease *catchup.Lease, deliver func(e eventstore.Event, id int64) error) error {
	type entry struct {
		id int64
		e  eventstore.Event
	}
	var entries []entry
	var gone []int64 // released entries whose events are no longer in the log
	var firstGone eventstore.Event
	err := lease.Do(ctx, func(conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, f.q["Released"], lease.Subscriber, lease.Partition, 500)
		if err != nil {
			return err
		}
		var id int64
		var isGone bool
		var meta []byte
		var e eventstore.Event
		_, err = pgx.ForEachRow(rows, []any{&id, &isGone, &e.GlobalSequence, &e.ID, &e.StreamID, &e.StreamVersion, &e.Type, &e.Data, &meta, &e.RecordedAt}, func() error {
			ev := e
			e.Data = nil
			if isGone {
				if len(gone) == 0 {
					firstGone = ev
				}
				gone = append(gone, id)
				return nil
			}
			if len(meta) > 0 {
				if err := ev.Metadata.UnmarshalJSON(meta); err != nil {
					return err
				}
			}
			entries = append(entries, entry{id, ev})
			return nil
		})
		return err
	})
	if err != nil {
		return errors.Wrap(err, "projection: read released dead letters")
	}
	settled := 0
	if len(gone) > 0 {
		// Nothing can deliver them, and every batch read would count them
		// released, which holds the partition in re-delivery: they are
		// settled (skipped, with the reason) before the rest is delivered.
		if settled, err = settleGone(ctx, f, lease, gone, firstGone); err != nil {
			return err
		}
	}
	if len(entries) == 0 && settled == 0 {
		// The batch read counted released entries that are gone now (an
		// operator skipped or purged them): wait a retry interval, no spinning.
		return errors.New("projection: the released dead letters were resolved by someone else")
	}
	blocked := map[string]bool{}
	for _, en := range entries {
		if blocked[en.e.StreamID] {
			continue // reopened with the entry before it
		}
		err := deliver(en.e, en.id)
		var he handlerError
		if err == nil {
			continue
		}
		if !errors.As(err, &he) {
			return err
		}
		blocked[en.e.StreamID] = true
		cause := errors.Wrapf(he.error, "%q: re-delivery of event %d (%s, stream %s v%d)", f.name, en.e.GlobalSequence, en.e.Type, en.e.StreamID, en.e.StreamVersion)
		if _, ferr := f.recordFailure(ctx, lease, en.e, cause); ferr != nil {
			return ferr
		}
		err = lease.Do(ctx, func(conn *pgx.Conn) error {
			return f.beginFunc(ctx, conn, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, f.q["Reopen"], lease.Subscriber, lease.Partition, en.id, en.e.StreamID, errorText(cause), errorDetail(cause))
				if err != nil || f.policy != Stop {
					return err
				}
				// Under Stop, a failed re-delivery halts the partition again.
				return f.stop(ctx, tx, lease, "event "+en.e.ID.String()+" failed again: "+errorText(cause))
			})
		})
		if err != nil {
			return errors.Wrap(err, "projection: reopen a dead letter")
		}
		f.logger.WarnContext(ctx, "annals: re-delivery failed; the dead letter is open again",
			slog.String("subscriber", f.name), slog.Int64("position", en.e.GlobalSequence), telemetry.Err(cause))
		if f.policy == Stop {
			return nil // the next read sees the stop reason; nothing after it runs
		}
	}
	return nil
}

// settleGone marks skipped the released dead letters ids, whose events are
// no longer in the log (first is the first of them, for the log), fenced
// like every write of a leader, and returns how many it settled (not those
// an operator skipped meanwhile). It logs one warning for them all.
func settleGone(ctx context.Context, f *failures, lease *catchup.Lease, ids []int64, first eventstore.Event) (int, error) {
	var settled []int64
	err := lease.Do(ctx, func(conn *pgx.Conn) error {
		return f.beginFunc(ctx, conn, func(tx pgx.Tx) error {
			// Fenced like every write: a no-op checkpoint move checks the epoch.
			if err := lease.Commit(ctx, tx, 0); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, f.q["SettleGone"], ids)
			if err != nil {
				return err
			}
			settled, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			return err
		})
	})
	if err != nil {
		return 0, errors.Wrap(err, "projection: skip released dead letters whose events are gone")
	}
	if len(settled) > 0 {
		f.logger.WarnContext(ctx, "annals: released dead letters skipped: their events no longer exist in the log "+
			"(removed by a hard delete and scavenge, a truncation or retention)",
			slog.String("subscriber", f.name), slog.Int("partition", lease.Partition),
			slog.Int("dead_letters", len(settled)), slog.Any("ids", settled[:min(len(settled), 20)]),
			slog.Int64("first_position", first.GlobalSequence), slog.String("first_stream", first.StreamID))
	}
	return len(settled), nil
}

// observerProcessor runs an Observer outside any transaction, with batched
// checkpoints written through Lease.CommitConn (see Start).
type observerProcessor struct {
	o        Observer
	f        *failures
	every    int
	interval time.Duration
	batcher  *checkpoint.Batcher
	handle   handlerFunc // o.Handle, bound once
}

func (p *observerProcessor) Start(ctx context.Context, lease *catchup.Lease) error {
	p.f.inherit(ctx, lease)
	// The checkpoint write is its own transaction, sent with its BEGIN and
	// COMMIT in one round trip (Lease.CommitConn): fenced by the epoch (and,
	// for a lease on the lock session, by the lock being held), and, for a
	// batch read while the partition was behind its head, committed without
	// waiting for its WAL flush, as a projection's batch is ("Committing
	// while behind" in package catchup). A crash of the server can then
	// lose such a write, and the events since the last durable one are
	// delivered again: what an observer promises (at least once) holds.
	// Like a projection's batch, the write also notifies Await's waiters
	// (NotifyCheckpoint, after COMMIT).
	commit := func(ctx context.Context, pos int64) error {
		if lease.Ephemeral() {
			return nil
		}
		return lease.Do(ctx, func(conn *pgx.Conn) error { return lease.CommitConn(ctx, conn, true, pos) })
	}
	p.batcher = checkpoint.NewBatcher(commit, lease.Start, p.every, p.interval, nil)
	return nil
}

func (p *observerProcessor) Process(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (done int64, err error) {
	ctx, end := p.f.batchTelemetry(ctx, lease, b)
	defer func() {
		p.f.releaseContext()
		end(handledThrough(b, done), err)
	}()
	return p.process(ctx, lease, b)
}

func (p *observerProcessor) process(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (int64, error) {
	if p.handle == nil {
		p.handle = p.o.Handle
	}
	park, err := p.f.loadParked(ctx, lease, b)
	if err != nil {
		return b.After, err
	}
	done := b.After
	handled := 0
	for i := 0; i < len(b.Events); i++ {
		e := b.Events[i]
		// A leader that lost its lock, or a run shutting down, delivers no more.
		select {
		case <-lease.Lost():
			return done, p.advance(ctx, done, handled, errors.Wrap(advisorylock.ErrLost, "projection: lock lost"))
		case <-lease.Stopping():
			return done, p.advance(ctx, done, handled, nil)
		default:
		}
		if park.holds(e) {
			if err := p.inLock(ctx, lease, func(conn *pgx.Conn) error {
				return p.f.deadLetter(ctx, conn, lease, e, "parked", park.status(e.StreamID), p.f.parkedError(e))
			}); err != nil {
				return done, p.advance(ctx, done, handled, err)
			}
			p.f.deadLettered(ctx, e, "parked", p.f.parkedError(e))
			done, handled = e.GlobalSequence, handled+1
			continue
		}
		err := p.f.deliver(ctx, e, p.handle)
		if err == nil {
			if p.f.retried(e) {
				// Best effort: left behind, the rows only cost space.
				if ferr := p.inLock(ctx, lease, func(conn *pgx.Conn) error { return p.f.forget(ctx, conn, e) }); ferr != nil {
					p.f.logger.WarnContext(ctx, "annals: deleting the failed attempts of a handled event failed", slog.String("subscriber", p.f.name), telemetry.Err(ferr))
				}
				p.f.forgotten(e)
			}
			done, handled = e.GlobalSequence, handled+1
			continue
		}
		err = errors.Wrapf(err, "observer %q: event %d (%s, stream %s v%d)", p.o.Name(), e.GlobalSequence, e.Type, e.StreamID, e.StreamVersion)
		retry, ferr := p.f.afterFailure(ctx, lease, e, err)
		switch {
		case errors.Is(ferr, errStopping):
			return done, p.advance(ctx, done, handled, nil)
		case ferr != nil:
			return done, p.advance(ctx, done, handled, ferr)
		case retry:
			i-- // the same event again
			continue
		}
		// Everything before e is delivered or dead-lettered, so the dead
		// letter (and a stop) and the checkpoint at e commit together.
		if err := p.inLock(ctx, lease, func(conn *pgx.Conn) error {
			return p.f.beginFunc(ctx, conn, func(tx pgx.Tx) error {
				if err := p.f.deadLetter(ctx, tx, lease, e, "failed", "open", err); err != nil {
					return err
				}
				return lease.Commit(ctx, tx, e.GlobalSequence)
			})
		}); err != nil {
			return done, p.advance(ctx, done, handled, err)
		}
		p.f.deadLettered(ctx, e, "failed", err)
		done, handled = e.GlobalSequence, 0
		p.batcher.Committed(done)
		if p.f.policy == ParkStream {
			if _, ok := park[e.StreamID]; !ok {
				park[e.StreamID] = parkState{open: true, first: e.GlobalSequence}
			}
		}
		if p.f.policy == Stop {
			return done, nil // the next read sees the stop reason
		}
	}
	return b.Through, p.advance(ctx, b.Through, handled, nil)
}

// advance moves the batched checkpoint and returns cause, or both cause
// and the write's error (see combine).
func (p *observerProcessor) advance(ctx context.Context, pos int64, events int, cause error) error {
	if err := p.batcher.Advance(ctx, pos, events); err != nil {
		return combine(err, cause)
	}
	return cause
}

func (p *observerProcessor) inLock(ctx context.Context, lease *catchup.Lease, fn func(conn *pgx.Conn) error) error {
	if lease.Ephemeral() {
		return nil
	}
	return lease.Do(ctx, fn)
}

// Redeliver re-delivers released dead letters in position order. Each is
// delivered inside a transaction that holds its row lock (lockRedelivery,
// bounded by the handler timeout) and resolves it after the handler
// returned, so that an operator's Skip meanwhile waits and finds it
// resolved, rather than marking skipped an entry the handler got.
func (p *observerProcessor) Redeliver(ctx context.Context, lease *catchup.Lease) error {
	defer p.f.releaseContext()
	return redeliver(ctx, p.f, lease, func(e eventstore.Event, id int64) error {
		return lease.Do(ctx, func(conn *pgx.Conn) error {
			return pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{BeginQuery: p.f.redeliveryBegin}, func(tx pgx.Tx) error {
				// Fenced like every write, before the handler runs (a fenced
				// leader delivers nothing): a no-op checkpoint move checks the
				// epoch. It locks the checkpoint row before the dead letter's,
				// in the order an operator's checkpoint move takes them
				// (checkpoint.Store.Move), so the two cannot deadlock.
				if err := lease.Commit(ctx, tx, 0); err != nil {
					return err
				}
				if ok, err := lockRedelivery(ctx, tx, p.f, id); err != nil || !ok {
					return err
				}
				if err := p.f.deliver(ctx, e, func(ctx context.Context, e eventstore.Event) error { return p.o.Handle(ctx, e) }); err != nil {
					return handlerError{err} // rolls back: the entry is reopened after
				}
				return resolve(ctx, tx, p.f, id)
			})
		})
	})
}

// Idle writes the checkpoint when CheckpointInterval has passed since the
// last write: an idle observer does not write once per event at low rates.
func (p *observerProcessor) Idle(ctx context.Context, _ *catchup.Lease) error {
	if p.batcher == nil {
		return nil
	}
	return p.batcher.FlushIfDue(ctx)
}

// NextIdle returns when the buffered checkpoint comes due (zero when it is
// written): the engine ends an idle wait then, so that a caught-up observer
// writes it within CheckpointInterval, not at the next poll.
func (p *observerProcessor) NextIdle() time.Time {
	if p.batcher == nil {
		return time.Time{}
	}
	return p.batcher.Due()
}

// nextIdle is p's NextIdle if it implements catchup.IdleDeadliner, else the
// zero time (no deadline). A wrapper that embeds a catchup.Processor
// forwards NextIdle through it: the embedding alone hides the method.
func nextIdle(p catchup.Processor) time.Time {
	if d, ok := p.(catchup.IdleDeadliner); ok {
		return d.NextIdle()
	}
	return time.Time{}
}

// End writes the checkpoint: a graceful shutdown re-delivers nothing.
func (p *observerProcessor) End(ctx context.Context, _ *catchup.Lease) error {
	if p.batcher == nil {
		return nil
	}
	return p.batcher.Flush(ctx)
}

// idleLimit is the idle_in_transaction_session_timeout of the transactions
// a leader opens on its lease's connection (its batches, dead letters and
// re-deliveries): the handler timeout (the longest a handler may work
// between two statements of the transaction) plus the lock's FreezeTimeout
// (the longest a live process may go without running). A transaction idle
// for longer is a frozen process's (or a handler's that overran its
// timeout by that much, whose batch fails anyway): the server ends its
// session, and with it the row locks that would hold up the partition's
// next leader, which took the partition over once the frozen lock session
// was ended (advisorylock, "A frozen holder"). 0: none, when the handlers
// have no timeout or FreezeTimeout is -1.
func idleLimit(handler time.Duration, lock *advisorylock.Config) time.Duration {
	freeze := advisorylock.FreezeTimeoutOf(lock)
	if handler <= 0 || freeze <= 0 {
		return 0
	}
	return handler + freeze
}

// beginFunc runs fn in a transaction on conn, begun with its idle limit
// (in BEGIN's round trip), as pgx.BeginFunc does.
func (f *failures) beginFunc(ctx context.Context, conn *pgx.Conn, fn func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{BeginQuery: f.begin}, fn)
}
