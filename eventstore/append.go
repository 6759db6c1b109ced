package eventstore

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/freshids"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/telemetry"
	"github.com/annals-dev/annals/internal/txopts"
)

// AppendResult describes one successful append.
type AppendResult struct {
	// StreamID is the stream appended to.
	StreamID string
	// StreamVersion is the version of the append's last event: the stream's
	// version after the append, and the expected version for the next one.
	// (For an idempotent re-append it is the stored version of that event.)
	StreamVersion int64
	// Events holds the position of each appended event, in order.
	Events []AppendedEvent
}

// AppendedEvent is the stored position of one appended event.
type AppendedEvent struct {
	// ID is the event's ID.
	ID uuid.UUID
	// GlobalSequence is its position in the log.
	GlobalSequence int64
	// StreamVersion is its version in the stream.
	StreamVersion int64
}

// Append appends events to streamID in one transaction of its own, if the
// stream's version matches expected. The lock that orders positions, the
// insert and the commit travel in one round trip.
//
// Errors: ErrWrongExpectedVersion (errors.As *WrongExpectedVersionError for
// the actual version), ErrInvalidEvent, ErrUnknownEventType and
// ErrEventIDConflict; in every case nothing is written. When ctx ends or
// the connection fails, the error says which of two things happened:
//
//   - ErrNotWritten (and ctx's error, when ctx ended): ctx ended before
//     the append was sent, or no connection could be had for it. Nothing
//     was written; append again as you like.
//   - ErrOutcomeUnknown, an *OutcomeUnknownError (matching ctx's error
//     when ctx ended): the append was on its way when ctx ended, or its
//     connection or session failed without an answer. It may have been
//     written. Append the same events again with the event IDs the error
//     holds (OutcomeUnknownError.EventIDs, as EventData.ID): that returns
//     the stored positions if it was written, and appends it if not.
//
// Through group commit (the default) an Append returns at ctx's end even
// while its group goes on for others. With inline projections (an Append
// whose events one handles), the append and its COMMIT go together after
// the handlers: sent without an answer (the connection failed, or ctx
// ended once they were on their way), the error is an
// *OutcomeUnknownError as above; a context that ended before they were
// sent is ErrNotWritten (nothing was written).
//
// An Append made again after an unknown outcome, while the first attempt
// still commits, answers as the first: its stored positions, or
// ErrEventIDConflict if the stored events differ. So it does through inline
// projections, also when a handler of the retry fails on what the first
// attempt's handlers wrote (a read model row keyed by the event, which the
// retry's waited for): the IDs are looked up again after such a failure.
func (s *Store) Append(ctx context.Context, streamID string, expected ExpectedVersion, events ...EventData) (res AppendResult, err error) {
	ctx, done := s.trace(ctx, "annals.append", streamID, expected, len(events))
	defer func() { done(res, err) }()
	args, err := s.encode(ctx, streamID, expected, events)
	if err != nil {
		return AppendResult{}, err
	}
	if s.inline.wants(&args) {
		return s.appendInline(ctx, args)
	}
	if s.group == nil {
		if err := ctx.Err(); err != nil {
			return AppendResult{}, notWritten(err)
		}
		res, err := s.appendAlone(ctx, args)
		if err != nil {
			err = failedErr(ctx, &args, err)
		}
		return res, err
	}
	return s.group.append(ctx, args)
}

// appendAlone runs one append_events_json call as a transaction of its
// own (append_events, on a schema or for a role without it: appendQuery).
// A 42501 of append_events_json, which the Store's knowledge of the
// session's roles said it could execute (privileges changed since), is
// sent again once, after asking afresh: the statement was a transaction of
// its own, and nothing was written.
func (s *Store) appendAlone(ctx context.Context, args appendArgs) (AppendResult, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return AppendResult{}, err
	}
	defer conn.Release()
	tries := 0
	for again := false; ; again = true {
		fn, err := s.appendFunction(ctx, conn.Conn())
		if err != nil {
			return AppendResult{}, err
		}
		var q string
		var res AppendResult
		switch fn {
		case appendFnAsk:
			q, res, err = s.appendAloneAsking(ctx, conn.Conn(), args)
		default:
			q = s.appendStatement(fn)
			rows, qerr := conn.Query(ctx, q, append(s.loneMode, args.stream, args.expected, json.RawMessage(args.json()))...)
			res, err = collectAppend(rows, qerr, args)
		}
		if s.appendRefused(conn.Conn(), q, err) && !again {
			continue
		}
		// A transaction of its own that failed to serialize committed
		// nothing (serializationRetries).
		if tries++; pgtx.Retryable(err) && tries < serializationRetries && ctx.Err() == nil {
			continue
		}
		return res, err
	}
}

// appendAloneAsking is appendAlone for a session whose user may take
// roles of both kinds (appendFnAsk): it asks which function the role in
// effect may execute and sends the append through it in one explicit
// transaction, so that a proxy pooling transactions (PgBouncer's
// pool_mode=transaction) runs both on the server session whose role was
// asked; as two statements of their own they could run on two sessions,
// with different roles left set. Pipelined, it costs the two round trips
// of two statements: BEGIN with the question, then the append with
// COMMIT. It returns the statement of the append ("" if it was not sent).
func (s *Store) appendAloneAsking(ctx context.Context, conn *pgx.Conn, args appendArgs) (string, AppendResult, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(s.q.appendJSONUsable)
	br := conn.SendBatch(ctx, b)
	_, err := br.Exec()
	var usable bool
	if err == nil {
		err = br.QueryRow().Scan(&usable)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		rollbackAlone(ctx, conn)
		return "", AppendResult{}, errors.Wrap(translate(err, "", Any), "eventstore: look up append_events_json")
	}
	q := s.q.appendJSONB
	if usable {
		q = s.q.append
	}
	b = &pgx.Batch{}
	b.Queue(q, args.stream, args.expected, json.RawMessage(args.json()))
	b.Queue("COMMIT")
	br = conn.SendBatch(ctx, b)
	rows, qerr := br.Query()
	res, err := collectAppend(rows, qerr, args)
	if err == nil {
		if _, cerr := br.Exec(); cerr != nil {
			err = errors.Wrap(translate(cerr, args.stream, args.exp), "eventstore: commit")
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = errors.Wrap(translate(cerr, args.stream, args.exp), "eventstore: commit")
	}
	if err != nil {
		rollbackAlone(ctx, conn)
		if s.mode == pgx.QueryExecModeSimpleProtocol && !answered(err) {
			// pgx (v5.12) reports a simple-protocol batch whose answer
			// was lost as safe to retry, sent or not: once BEGIN went
			// through, the append and its COMMIT may have been.
			err = mayHaveBeenSent{err}
		}
		return q, AppendResult{}, err
	}
	return q, res, nil
}

// mayHaveBeenSent wraps the error of a statement that may have reached the
// server although pgx says it was safe to retry (unsent sees through it no
// further).
type mayHaveBeenSent struct{ error }

// SafeToRetry reports false: the statement may have been sent.
func (mayHaveBeenSent) SafeToRetry() bool { return false }

// Unwrap returns the error of pgx.
func (e mayHaveBeenSent) Unwrap() error { return e.error }

// rollbackAlone ends the transaction appendAloneAsking left open or failed
// on conn, if one is; should it fail, the pool closes the connection on
// its release (it does so with any not idle).
func rollbackAlone(ctx context.Context, conn *pgx.Conn) {
	if st := conn.PgConn().TxStatus(); st == 'T' || st == 'E' {
		_, _ = conn.Exec(ctx, "ROLLBACK")
	}
}

// The SQL function of an append through the Append query, as the Store
// knows it for a session user (Store.appendFns).
const (
	appendFnJSON  int32 = 1 // append_events_json (migration 0035): the events as sent
	appendFnJSONB int32 = 2 // append_events: the events as jsonb renders them
	appendFnAsk   int32 = 3 // either, by the role: asked in each transaction
)

// appendFnRecheck is how long the Store keeps an answer other than
// appendFnJSON for a session user before asking again: a schema migrated
// to 0035, or roles granted by annals grant since, then get
// append_events_json without a restart. (appendFnJSON is kept until a
// 42501 says otherwise: see appendRefused.)
const appendFnRecheck = time.Minute

// appendChoice is what the Store knows of a session user (an entry of
// Store.appendFns, or of a connection's CustomData).
type appendChoice struct {
	// fn is the answer while the role in effect is not a superuser, super
	// while it is (the is_superuser the server reports), and unknown while
	// that is not reported (a proxy that reports no parameters): the
	// answer over every role, superusers included.
	fn, super, unknown int32
	// until is when the answer is to be asked again (zero: never).
	until time.Time
}

// The parameters the server reports (ParameterStatus) that appendFunction
// reads: the session's user, which SET ROLE does not change, and whether
// the role in effect is a superuser, which SET ROLE does.
const (
	paramSessionUser = "session_authorization"
	paramSuperuser   = "is_superuser"
)

// appendQuery returns the statement of an append in conn's session (in
// its transaction, if one is open): append_events_json, which stores each
// event's data and metadata as sent, or append_events, which stores them
// as jsonb renders them (keys sorted, numbers spelled out), as every
// version before 0035 did, for a role that may not execute
// append_events_json (a schema migrated before 0035, a role an annals
// grant older than it granted). When appendFunction cannot tell without
// asking about the role in effect, it asks (a round trip).
func (s *Store) appendQuery(ctx context.Context, conn *pgx.Conn) (string, error) {
	fn, err := s.appendFunction(ctx, conn)
	if err != nil {
		return "", err
	}
	if fn == appendFnAsk {
		return s.appendQueryForRole(ctx, conn)
	}
	return s.appendStatement(fn), nil
}

// appendStatement returns the statement of appendFnJSON or appendFnJSONB.
func (s *Store) appendStatement(fn int32) string {
	if fn == appendFnJSONB {
		return s.q.appendJSONB
	}
	return s.q.append
}

// appendFunction returns the append function of conn's session as far as
// the Store knows it without asking about the role in effect:
// appendFnJSON, appendFnJSONB, or appendFnAsk (ask the role).
//
// The function is chosen by the role, which a Store used with several
// roles (transactions of other pools, SET ROLE per tenant) must do per
// transaction, without a round trip in the common case. The server reports
// each session's user (session_authorization, which SET ROLE does not
// change) and whether the role in effect is a superuser (is_superuser,
// which SET ROLE does) on its own; the Store asks, once per session user,
// about every role that user may become by SET ROLE (itself and the roles
// it is a member of; every role, for a superuser): if every one of them
// that may execute append_events may execute append_events_json, it is
// append_events_json whatever the role (a role that may execute neither
// fails either way); if none may execute append_events_json,
// append_events; else (a user that may become roles of both kinds) the
// role in effect is asked in each transaction, a round trip. A superuser
// in effect may execute any function: append_events_json wherever it
// exists, whatever other roles of the cluster were granted (a superuser
// session is asked about the others only once it takes one of them by
// SET ROLE). An answer other than append_events_json is asked again after
// appendFnRecheck. So one session user costs one question per Store, and
// each append a look-up of its user's answer (BenchmarkAppendQuery).
//
// A proxy that does not report the session's user (some poolers) leaves
// it unknown: the answer is then kept with the connection (its
// CustomData) instead of under a user that every such session would
// share, so each connection asks once.
func (s *Store) appendFunction(ctx context.Context, conn *pgx.Conn) (int32, error) {
	pc := conn.PgConn()
	user := pc.ParameterStatus(s.param.sessionUser)
	var c *appendChoice
	if user != "" {
		if v, ok := s.appendFns.Load(user); ok {
			c = v.(*appendChoice)
		}
	} else if v, ok := pc.CustomData()[s.param.connKey]; ok {
		c = v.(*appendChoice)
	}
	if c == nil || (!c.until.IsZero() && !time.Now().Before(c.until)) {
		c = &appendChoice{}
		if err := conn.QueryRow(ctx, s.q.appendFunction).Scan(&c.fn, &c.super, &c.unknown); err != nil {
			return 0, errors.Wrap(translate(err, "", Any), "eventstore: look up the append function")
		}
		if c.fn != appendFnJSON || c.super != appendFnJSON || c.unknown != appendFnJSON {
			c.until = time.Now().Add(appendFnRecheck)
		}
		switch cd := pc.CustomData(); {
		case user != "":
			s.appendFns.Store(user, c)
		case cd != nil:
			cd[s.param.connKey] = c
		}
	}
	switch pc.ParameterStatus(s.param.superuser) {
	case "on":
		return c.super, nil
	case "off":
		return c.fn, nil
	}
	return c.unknown, nil
}

// appendQueryForRole returns the statement of an append by the role in
// effect in conn's session, which it asks (a round trip).
func (s *Store) appendQueryForRole(ctx context.Context, conn *pgx.Conn) (string, error) {
	var usable bool
	if err := conn.QueryRow(ctx, s.q.appendJSONUsable).Scan(&usable); err != nil {
		return "", errors.Wrap(translate(err, "", Any), "eventstore: look up append_events_json")
	}
	if usable {
		return s.q.append, nil
	}
	return s.q.appendJSONB, nil
}

// appendRefused reports whether err is the 42501 of an append through the
// statement q (append_events_json) in conn's session; if so, the Store
// forgets what it knew of the session's user (or of the connection, when
// the user is unknown), and asks again at its next append: the privileges
// changed since it asked (an older annals grant granted a role
// append_events only, a role was made a member of another).
func (s *Store) appendRefused(conn *pgx.Conn, q string, err error) bool {
	if q != s.q.append || !errors.Is(err, ErrNotGranted) {
		return false
	}
	pc := conn.PgConn()
	if user := pc.ParameterStatus(s.param.sessionUser); user != "" {
		s.appendFns.Delete(user)
	} else {
		delete(pc.CustomData(), s.param.connKey)
	}
	return true
}

// trace starts the span of one append and returns the function that ends it
// and records the append's metrics.
func (s *Store) trace(ctx context.Context, name, streamID string, expected ExpectedVersion, n int) (context.Context, func(AppendResult, error)) {
	start := time.Now()
	ctx, span := s.tel.Tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		attribute.String("annals.stream_id", streamID),
		attribute.Int("annals.event_count", n),
		attribute.String("annals.expected_version", expected.String()),
	))
	return ctx, func(res AppendResult, err error) {
		outcome := "ok"
		if err != nil {
			outcome = "error"
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else if len(res.Events) > 0 {
			span.SetAttributes(
				attribute.Int64("annals.global_sequence.first", res.Events[0].GlobalSequence),
				attribute.Int64("annals.global_sequence.last", res.Events[len(res.Events)-1].GlobalSequence),
				attribute.Int64("annals.stream_version", res.StreamVersion),
			)
			s.tel.Events.Add(ctx, int64(len(res.Events)))
		}
		s.tel.Duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(telemetry.Outcome.String(outcome)))
		span.End()
	}
}

// AppendTx appends events to streamID inside tx. The append takes the
// log's ordering lock, which is held until tx ends: make the append the last
// statement of tx and commit promptly, or use Transact, which does both.
//
// The COMMIT is the caller's, and so is its outcome: a COMMIT whose answer
// was lost (its connection failed after it was sent) may have committed the
// append. Give the events IDs of your own (EventData.ID) if you may need to
// learn it: appending them again answers with the stored positions if the
// first transaction committed (see OutcomeUnknownError).
func (s *Store) AppendTx(ctx context.Context, tx pgx.Tx, streamID string, expected ExpectedVersion, events ...EventData) (res AppendResult, err error) {
	ctx, done := s.trace(ctx, "annals.append", streamID, expected, len(events))
	defer func() { done(res, err) }()
	args, err := s.encode(ctx, streamID, expected, events)
	if err != nil {
		return AppendResult{}, err
	}
	return s.appendTx(ctx, tx, args)
}

// appendTx sends one append in tx, after the inline projections.
func (s *Store) appendTx(ctx context.Context, tx pgx.Tx, args appendArgs) (res AppendResult, err error) {
	q, err := s.appendQuery(ctx, tx.Conn())
	if err != nil {
		return AppendResult{}, err
	}
	defer func() { s.appendRefused(tx.Conn(), q, err) }()
	if !s.inline.wants(&args) {
		rows, err := tx.Query(ctx, q, args.stream, args.expected, json.RawMessage(args.json()))
		return collectAppend(rows, err, args)
	}
	run := &inlineRun{s: s, versions: map[string]int64{}}
	plan, err := run.apply(ctx, tx, &args)
	if err != nil {
		return AppendResult{}, err
	}
	if !plan.guard {
		rows, err := tx.Query(ctx, q, args.stream, args.expected, json.RawMessage(args.json()))
		res, err := collectAppend(rows, err, args)
		return res, plan.explain(err, args)
	}
	// The append and its guard in one round trip.
	batch := &pgx.Batch{}
	batch.Queue(q, args.stream, args.expected, json.RawMessage(args.json()))
	s.queueGuard(batch, plan)
	br := tx.SendBatch(ctx, batch)
	rows, qerr := br.Query()
	res, err = collectAppend(rows, qerr, args)
	err = plan.explain(err, args)
	if err == nil {
		if _, gerr := br.Exec(); gerr != nil {
			err = guardError(gerr)
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = errors.Wrap(cerr, "eventstore: append")
	}
	if err != nil {
		return AppendResult{}, err
	}
	return res, nil
}

// Batch stages appends inside Transact. Its methods are not safe for
// concurrent use.
type Batch struct {
	s       *Store
	ctx     context.Context // the Transact span's, for trace context
	appends []appendArgs
}

// Append validates and encodes an append and stages it to run after the
// transaction body returns. Invalid input is reported here, at once.
func (b *Batch) Append(streamID string, expected ExpectedVersion, events ...EventData) error {
	args, err := b.s.encode(b.ctx, streamID, expected, events)
	if err != nil {
		return err
	}
	b.appends = append(b.appends, args)
	return nil
}

// Transact runs fn in a new transaction; fn does its own work with tx (it
// must not commit or roll back) and stages appends on b. Then the staged
// appends and the COMMIT are sent together in one round trip, so the log's
// ordering lock is held only for the server-side time of the appends and the
// commit, never for a network round trip or for fn's work.
//
// If fn returns an error, or any append fails, the transaction rolls back
// and nothing of it is kept. The results are in staging order.
//
// When the appends and the COMMIT (or the COMMIT alone, with nothing
// staged) were sent and their answer was lost (the connection failed, or
// ctx ended once they were on their way), the error matches
// ErrOutcomeUnknown (not as an *OutcomeUnknownError: there may be
// several appends): the transaction, fn's own writes with it, may have
// committed. Do not simply run fn's work again. Stage the same appends
// with the same event IDs (give them IDs of your own, EventData.ID, if you
// may retry): a committed first attempt makes them idempotent re-appends,
// answered with its stored positions, so a fn that checks first (reading
// the stream in tx, say) can tell.
func (s *Store) Transact(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx, b *Batch) error) (results []AppendResult, err error) {
	if fn == nil {
		return nil, errors.New("eventstore: Transact: fn is nil")
	}
	start := time.Now()
	if txopts.IsQuietWhenEmpty(ctx) {
		// A package of annals (the scheduler's claims) asks for telemetry
		// only if the transaction appends or fails: the span is made
		// afterwards, from start (internal/txopts).
		opts, tctx := txopts.Take(ctx)
		results, err = s.transact(tctx, opts, fn)
		err = transactOutcome(err)
		if err != nil || len(results) > 0 {
			_, span := s.tel.Tracer.Start(ctx, "annals.transact", trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(start))
			s.recordTransact(ctx, span, start, results, err)
		}
		return results, err
	}
	ctx, span := s.tel.Tracer.Start(ctx, "annals.transact", trace.WithSpanKind(trace.SpanKindProducer))
	defer func() { s.recordTransact(ctx, span, start, results, err) }()
	// The session's defaults, unless a package of annals asks for others
	// (internal/txopts: the scheduler's claims run READ COMMITTED), for this
	// transaction only: the body gets a context that asks for nothing.
	opts, ctx := txopts.Take(ctx)
	results, err = s.transact(ctx, opts, fn)
	return results, transactOutcome(err)
}

// transactOutcome marks the error of a Transact whose appends and COMMIT
// were sent and got no answer (errSentLost) with ErrOutcomeUnknown: the
// transaction may have committed.
func transactOutcome(err error) error {
	if errors.Is(err, errSentLost) {
		return errmark.Mark(err, ErrOutcomeUnknown)
	}
	return err
}

// recordTransact ends a Transact's span, begun at start, and records its
// append metrics: its outcome, and the appends and events it committed.
func (s *Store) recordTransact(ctx context.Context, span trace.Span, start time.Time, results []AppendResult, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	n := 0
	for _, r := range results {
		n += len(r.Events)
	}
	span.SetAttributes(attribute.Int("annals.append_count", len(results)), attribute.Int("annals.event_count", n))
	s.tel.Events.Add(ctx, int64(n))
	s.tel.Duration.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(telemetry.Outcome.String(outcome)))
	span.End()
}

// transact is Transact without its span, in a transaction begun with opts
// (the zero value: the session's defaults): fn, then the inline projections
// over the appends fn staged, then the appends and COMMIT.
func (s *Store) transact(ctx context.Context, opts pgx.TxOptions, fn func(ctx context.Context, tx pgx.Tx, b *Batch) error) (results []AppendResult, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, errors.Wrap(err, "eventstore: acquire connection")
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		return nil, errors.Wrap(err, "eventstore: begin")
	}
	// Once the batch below has committed, Rollback is a no-op on the server
	// ("no transaction in progress") and pgx reports nothing we need.
	rollback := func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }

	b := &Batch{s: s, ctx: ctx}
	if err := fn(ctx, tx, b); err != nil {
		rollback()
		return nil, err
	}
	if conn.Conn().PgConn().TxStatus() != 'T' {
		rollback()
		return nil, errors.New("eventstore: the Transact body ended its transaction (it must not commit or roll back)")
	}
	if len(b.appends) == 0 {
		if err := tx.Commit(ctx); err != nil {
			// Without the server's answer, the body's writes may have
			// committed: outcome unknown, as with appends (Transact). pgx
			// sends a lone COMMIT in the simple protocol, and reports a
			// lost answer there as "conn closed", safe to retry.
			return nil, s.sentLost(errors.Wrap(err, "eventstore: commit"), true)
		}
		return nil, nil
	}
	plans := make([]inlinePlan, len(b.appends))
	for i := range plans {
		plans[i].pinned = -1
	}
	if s.inline != nil {
		run := &inlineRun{s: s, versions: map[string]int64{}}
		for i := range b.appends {
			if plans[i], err = run.apply(ctx, tx, &b.appends[i]); err != nil {
				rollback()
				return nil, err
			}
		}
	}

	// The append function of the role in effect now (fn may have run SET
	// ROLE): no round trip once the Store knows the session's user.
	q, err := s.appendQuery(ctx, conn.Conn())
	if err != nil {
		rollback()
		return nil, err
	}
	defer func() { s.appendRefused(conn.Conn(), q, err) }()
	batch := &pgx.Batch{}
	for i, a := range b.appends {
		batch.Queue(q, a.stream, a.expected, json.RawMessage(a.json()))
		s.queueGuard(batch, plans[i])
	}
	batch.Queue("COMMIT")
	br := conn.SendBatch(ctx, batch)
	results = make([]AppendResult, 0, len(b.appends))
	for i, a := range b.appends {
		rows, qerr := br.Query()
		res, err := collectAppend(rows, qerr, a)
		err = plans[i].explain(err, a)
		if err == nil && plans[i].guard {
			if _, gerr := br.Exec(); gerr != nil {
				err = guardError(gerr)
			}
		}
		if err != nil {
			_ = br.Close()
			rollback()
			return nil, s.sentLost(err, s.mode == pgx.QueryExecModeSimpleProtocol)
		}
		results = append(results, res)
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		rollback()
		return nil, s.sentLost(errors.Wrap(err, "eventstore: commit"), s.mode == pgx.QueryExecModeSimpleProtocol)
	}
	if tag.String() != "COMMIT" {
		rollback()
		return nil, errors.Newf("eventstore: commit answered %q: the transaction was rolled back", tag.String())
	}
	if conn.Conn().PgConn().TxStatus() != 'I' {
		return nil, errors.New("eventstore: transaction still open after COMMIT")
	}
	return results, nil
}

// errSentLost marks the error of a transaction's appends and COMMIT, sent
// together, whose answer was lost (answerLost): the transaction may have
// committed. appendInline makes it an *OutcomeUnknownError.
var errSentLost = errors.New("eventstore: the appends and COMMIT were sent, and their answer was lost")

// sentLost marks err with errSentLost when it leaves the outcome of the
// appends and COMMIT sent unknown (when they went in the simple protocol,
// whenever the server did not answer that they failed: pgx may report a
// lost answer there as safe to retry, as appendAloneAsking says; a lone
// COMMIT, tx.Commit's, always goes so, whatever the pool's mode).
func (s *Store) sentLost(err error, simple bool) error {
	if answerLost(err) || (simple && !answered(err)) {
		return errmark.Mark(err, errSentLost)
	}
	return err
}

// appendArgs are the encoded arguments of one append: the JSON array that
// append_events_json takes (payload), and the same events field by field
// for append_batch (events; nil for an EncodedAppend, which carries only
// JSON).
type appendArgs struct {
	stream   string
	expected any
	exp      ExpectedVersion
	payload  []byte
	count    int
	events   []encodedEvent
	// callerIDs reports whether some event ID came from the caller (and may
	// be stored already); IDs annals generated need no idempotency look-up.
	callerIDs bool
}

// json returns the JSON array that append_events_json takes, rendering it
// from the events the first time.
func (a *appendArgs) json() []byte {
	if a.payload != nil {
		return a.payload
	}
	n := 2
	for _, e := range a.events {
		n += 64 + len(e.typ) + len(e.data) + len(e.meta)
	}
	buf := make([]byte, 0, n)
	buf = append(buf, '[')
	for i, e := range a.events {
		if i > 0 {
			buf = append(buf, ',')
		}
		typ, _ := json.Marshal(e.typ) // a string always marshals
		buf = append(buf, `{"event_id":"`...)
		buf = append(buf, e.id.String()...)
		buf = append(buf, `","type":`...)
		buf = append(buf, typ...)
		buf = append(buf, `,"data":`...)
		buf = append(buf, e.data...)
		if e.meta != nil {
			buf = append(buf, `,"metadata":`...)
			buf = append(buf, e.meta...)
		}
		buf = append(buf, '}')
	}
	a.payload = append(buf, ']')
	return a.payload
}

// encodedEvent is one validated event of an append.
type encodedEvent struct {
	id   uuid.UUID
	typ  string
	data []byte
	meta []byte
}

// encode validates an append on the client and renders the JSON array that
// append_events_json takes. Everything the SQL function would reject for bad
// input is rejected here first, so a bad append costs no round trip.
func (s *Store) encode(ctx context.Context, streamID string, expected ExpectedVersion, events []EventData) (appendArgs, error) {
	if err := checkName(0, "stream_id", streamID, MaxStreamIDBytes); err != nil {
		return appendArgs{}, err
	}
	if err := checkExpected(expected, len(events)); err != nil {
		return appendArgs{}, err
	}
	exp, err := expected.sqlArg()
	if err != nil {
		return appendArgs{}, err
	}
	if len(events) == 0 {
		return appendArgs{}, invalidf("append to stream %q has no events", streamID)
	}
	tc := traceContext(ctx)         // once per append, nil without an active span
	var seen map[uuid.UUID]struct{} // IDs of this append, to refuse one twice; none needed for one event
	if len(events) > 1 {
		seen = make(map[uuid.UUID]struct{}, len(events))
	}
	encoded := make([]encodedEvent, 0, len(events))
	callerIDs := false
	fresh := freshids.In(ctx) // IDs generated for this append: none can be stored
	for i, e := range events {
		name := e.Type
		if reg, ok := s.registry.NameOf(e.Data); ok {
			if name != "" && name != reg {
				return appendArgs{}, invalidf("event %d: Type %q differs from %q, the name registered for %T", i+1, name, reg, e.Data)
			}
			name = reg
		}
		if name == "" {
			if e.Data == nil {
				return appendArgs{}, invalidf("event %d has no type and no data", i+1)
			}
			// Both a type the registry lacks and input without a type: it
			// matches ErrUnknownEventType and ErrInvalidEvent.
			return appendArgs{}, upcastError(errors.Wrapf(ErrUnknownEventType,
				"event %d: %T is not registered: eventstore.Register[%T](registry, \"its.type\") names it (or set EventData.Type)", i+1, e.Data, e.Data), ErrInvalidEvent)
		}
		if err := checkName(i+1, "type", name, MaxEventTypeBytes); err != nil {
			return appendArgs{}, err
		}
		if reservedType(name) {
			return appendArgs{}, &InvalidEventError{Event: i + 1, Field: "type", Reason: "starts with \"$stream.\", which is reserved for annals (see DeleteStream, annals stream delete)"}
		}
		data, err := encodeData(i+1, e.Data)
		if err != nil {
			return appendArgs{}, err
		}
		if data, err = s.registry.seal(ctx, i+1, name, e.ID, data); err != nil {
			return appendArgs{}, err
		}
		if err := checkMetadata(i+1, e.Metadata); err != nil {
			return appendArgs{}, err
		}
		var meta []byte
		md, err := s.registry.stamp(name, withTraceContext(tc, e.Metadata))
		if err != nil {
			return appendArgs{}, &InvalidEventError{Event: i + 1, Field: "metadata", Reason: err.Error()}
		}
		if !md.IsZero() {
			if meta, err = json.Marshal(md); err != nil {
				return appendArgs{}, invalidf("event %d (%s): metadata: %v", i+1, name, err)
			}
			if why := checkJSONText(meta, true); why != "" {
				return appendArgs{}, &InvalidEventError{Event: i + 1, Field: "metadata", Reason: why}
			}
		}
		if n := len(data) + len(meta); n > s.maxBytes {
			return appendArgs{}, tooLong(i+1, "data+metadata", n, s.maxBytes)
		}
		id := e.ID
		if id == uuid.Nil {
			if id, err = uuid.NewV7(); err != nil {
				return appendArgs{}, errors.Wrap(err, "generate event ID")
			}
		} else if !fresh {
			callerIDs = true
		}
		encoded = append(encoded, encodedEvent{id: id, typ: name, data: data, meta: meta})
		if _, dup := seen[id]; dup {
			return appendArgs{}, invalidf("event ID %s appears twice in one append", id)
		}
		if seen != nil {
			seen[id] = struct{}{}
		}
	}
	return appendArgs{stream: streamID, expected: exp, exp: expected, count: len(events),
		events: encoded, callerIDs: callerIDs}, nil
}

// traceContext returns the W3C trace context of ctx's span (traceparent,
// tracestate), or nil when there is no valid span: no allocation then.
func traceContext(ctx context.Context) map[string]any {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	tc := make(map[string]any, 2)
	if !telemetry.Inject(ctx, tc) {
		return nil
	}
	return tc
}

// withTraceContext returns m with tc added, without changing the caller's map.
func withTraceContext(tc map[string]any, m Metadata) Metadata {
	if tc == nil {
		return m
	}
	extra := make(map[string]any, len(m.Extra)+len(tc))
	for k, v := range m.Extra {
		extra[k] = v
	}
	for k, v := range tc {
		extra[k] = v
	}
	m.Extra = extra
	return m
}

// encodeData returns the JSON of the payload of event n (1-based), which
// must be an object or array that PostgreSQL's jsonb can hold.
func encodeData(n int, v any) ([]byte, error) {
	var raw []byte
	marshalled := false
	switch d := v.(type) {
	case nil:
		return nil, &InvalidEventError{Event: n, Field: "data", Reason: "is nil; it must be a JSON object or array"}
	case json.RawMessage:
		raw = d
	case []byte:
		raw = d
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, &InvalidEventError{Event: n, Field: "data", Reason: "does not encode to JSON: " + err.Error()}
		}
		raw, marshalled = b, true
	}
	// Without the JSON white space around the value: stored as it is by
	// append_one and append_batch, it would be stored without it by
	// append_events_json, which stores the value's own text.
	trimmed := bytes.Trim(raw, " \t\r\n")
	if len(trimmed) == 0 || (trimmed[0] != '{' && trimmed[0] != '[') {
		return nil, &InvalidEventError{Event: n, Field: "data", Reason: "must be a JSON object or array"}
	}
	// encoding/json's output is valid JSON (it checks what MarshalJSON
	// methods return); raw bytes are checked.
	if !marshalled && !json.Valid(trimmed) {
		return nil, &InvalidEventError{Event: n, Field: "data", Reason: "is not valid JSON"}
	}
	// encoding/json's output is valid UTF-8; raw bytes need not be, and
	// json.Valid does not check.
	if !marshalled && !utf8.Valid(trimmed) {
		return nil, &InvalidEventError{Event: n, Field: "data", Reason: "is not valid UTF-8"}
	}
	if why := checkJSONText(trimmed, marshalled); why != "" {
		return nil, &InvalidEventError{Event: n, Field: "data", Reason: why}
	}
	return trimmed, nil
}

func collectAppend(rows pgx.Rows, err error, a appendArgs) (AppendResult, error) {
	if err != nil {
		return AppendResult{}, translateAppend(err, a)
	}
	res := AppendResult{StreamID: a.stream, Events: make([]AppendedEvent, 0, a.count)}
	var ev AppendedEvent
	_, err = pgx.ForEachRow(rows, []any{&ev.ID, &ev.GlobalSequence, &ev.StreamVersion}, func() error {
		res.Events = append(res.Events, ev)
		return nil
	})
	if err != nil {
		return AppendResult{}, translateAppend(err, a)
	}
	if len(res.Events) != a.count {
		return AppendResult{}, errors.Newf("eventstore: the append returned %d rows for %d events", len(res.Events), a.count)
	}
	res.StreamVersion = res.Events[len(res.Events)-1].StreamVersion
	return res, nil
}

// translateAppend is translate for the failure of append a through
// append_events_json or append_events: it also turns PostgreSQL's refusal
// of JSON text that jsonb cannot hold (22P05: a \u0000; 22P02 of type json:
// an unpaired surrogate escape), which those functions raise before any
// check of their own, into the *InvalidEventError that the Go client's own
// check gives (it gives it before sending: this is for what it let through).
func translateAppend(err error, a appendArgs) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !(pgErr.Code == "22P05" || (pgErr.Code == "22P02" && strings.Contains(pgErr.Message, "json"))) {
		return translate(err, a.stream, a.exp)
	}
	why := pgErr.Message
	if pgErr.Detail != "" {
		why += ": " + pgErr.Detail
	}
	var located *InvalidEventError
	if errors.As(badText(a.stream, a.json(), why), &located) {
		return errors.WithStack(located)
	}
	return errors.WithStack(&InvalidEventError{Reason: "annals: PostgreSQL refused the events: " + why, sqlMessage: true})
}
