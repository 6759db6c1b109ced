package eventstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/lockfallback"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/recovered"
	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// InlineProjection is a projection applied in the transaction of every
// append through a Store that lists it in Config.Inline: its read-model
// writes commit together with the events, or not at all, so the writer
// never reads a stale read model. package projection's Projection (and its
// typed *projection.Typed) has exactly these methods.
//
// Handle runs before the append takes the log's ordering lock (see the
// package documentation, "Inline projections"): the event it gets has its
// ID, stream, stream version, type, data and metadata, but GlobalSequence
// is 0 and RecordedAt is zero, because both are assigned under that lock.
type InlineProjection interface {
	// Name identifies the projection in errors.
	Name() string
	// Handle applies one event inside tx. An error fails the append: the
	// transaction rolls back and nothing of it is stored.
	Handle(ctx context.Context, tx pgx.Tx, e Event) error
}

// inlineTypes is implemented by inline projections that know the event types
// they handle (projection.Typed does); appends of other types skip them, and
// keep the group-commit path of Append.
type inlineTypes interface {
	EventTypes() []string
}

// ErrInlineProjection is matched (errors.Is) by the error of an append that
// failed because an inline projection's Handle did; errors.As with
// *InlineError says which projection and event, and errors.Is also matches
// the handler's own error.
var ErrInlineProjection = errors.New("inline projection failed")

// InlineError reports an inline projection whose handler failed; the append
// stored nothing.
type InlineError struct {
	// Projection is the inline projection's name.
	Projection string
	// StreamID, StreamVersion, EventID and Type identify the event.
	StreamID      string
	StreamVersion int64
	EventID       uuid.UUID
	Type          string
	// Err is the handler's error.
	Err error
}

func (e *InlineError) Error() string {
	return fmt.Sprintf("eventstore: inline projection %q failed on event %s (%s, stream %q version %d): %v",
		e.Projection, e.EventID, e.Type, e.StreamID, e.StreamVersion, e.Err)
}

// Unwrap returns the handler's error.
func (e *InlineError) Unwrap() error { return e.Err }

// Is makes errors.Is match ErrInlineProjection.
func (e *InlineError) Is(target error) bool { return target == ErrInlineProjection }

// ErrStoredConcurrently is matched by an inline append (with caller-chosen
// event IDs) that failed because another transaction stored the same events
// between the look-up that precedes the inline handlers and the append: the
// handlers applied events this append did not write, so it was rolled back.
// Append retries it itself (the retry answers as an idempotent re-append);
// AppendTx and Transact return it, and the caller's retry does the same.
var ErrStoredConcurrently = errors.New("eventstore: an event ID of this inline append was stored concurrently; the append was rolled back")

// inline holds a Store's inline projections.
type inline struct {
	all    []InlineProjection
	byType map[string][]InlineProjection // projections that listed their types
	any    []InlineProjection            // projections that did not
	hot    hotStreams
}

// hotStreams remembers the streams whose inline Appends conflicted lately
// (see appendInline), each until a moment hotFor after its last conflict.
type hotStreams struct {
	mu    sync.Mutex
	until map[string]time.Time
}

const (
	// hotFor is how long a stream stays hot after a conflict.
	hotFor = time.Second
	// hotMax bounds the streams remembered; when full, expired ones are
	// dropped, and if none has expired a new one is not remembered (its
	// Appends then lock from their first retry only, as cold ones do).
	hotMax = 4096
)

// mark records a conflict on stream at now.
func (h *hotStreams) mark(stream string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.until == nil {
		h.until = make(map[string]time.Time)
	}
	if _, ok := h.until[stream]; !ok && len(h.until) >= hotMax {
		for k, t := range h.until {
			if now.After(t) {
				delete(h.until, k)
			}
		}
		if len(h.until) >= hotMax {
			return
		}
	}
	h.until[stream] = now.Add(hotFor)
}

// is reports whether stream conflicted within hotFor before now.
func (h *hotStreams) is(stream string, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.until[stream]
	if ok && now.After(t) {
		delete(h.until, stream)
		return false
	}
	return ok
}

func newInline(ps []InlineProjection) (*inline, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	in := &inline{byType: map[string][]InlineProjection{}}
	seen := map[string]bool{}
	for i, p := range ps {
		if p == nil {
			return nil, errors.Newf("eventstore: Config.Inline[%d] is nil", i)
		}
		if seen[p.Name()] {
			return nil, errors.Newf("eventstore: inline projection %q is listed twice", p.Name())
		}
		seen[p.Name()] = true
		in.all = append(in.all, p)
		if tl, ok := p.(inlineTypes); ok {
			for _, t := range tl.EventTypes() {
				in.byType[t] = append(in.byType[t], p)
			}
		} else {
			in.any = append(in.any, p)
		}
	}
	return in, nil
}

// wants reports whether some inline projection handles an event of a.
func (in *inline) wants(a *appendArgs) bool {
	if in == nil {
		return false
	}
	if len(in.any) > 0 {
		return true
	}
	if a.events == nil {
		evs, err := decodePayload(a.payload)
		if err != nil {
			return true // let apply report it
		}
		a.events = evs
	}
	for _, e := range a.events {
		if len(in.byType[e.typ]) > 0 {
			return true
		}
	}
	return false
}

// inlineRun is the state of the inline projections over one transaction:
// the stream versions its staged appends lead to.
type inlineRun struct {
	s        *Store
	versions map[string]int64
}

// inlinePlan is what apply decided for one append.
type inlinePlan struct {
	// stored: every event ID is stored already (an idempotent re-append) or
	// some are (an ID conflict): the handlers did not run, and the append
	// is sent as it is to answer or refuse it.
	stored bool
	// guard: some IDs came from the caller, so the append must be followed
	// by the InlineWritten check before COMMIT.
	guard bool
	// ids: the events' IDs, as pgtype.UUIDs: pgx encodes a []uuid.UUID only
	// when it has described the statement (not in QueryExecModeExec nor
	// QueryExecModeSimpleProtocol).
	ids []pgtype.UUID
	// pinned: the inline projections ran at this version of a stream the
	// caller appended to with Any or StreamExists, now the append's exact
	// expected version (-1: not pinned).
	pinned int64
}

// explain says why an append pinned by the inline projections failed with
// a wrong expected version the caller did not ask for.
func (p inlinePlan) explain(err error, a appendArgs) error {
	if p.pinned < 0 || !errors.Is(err, ErrWrongExpectedVersion) {
		return err
	}
	return errors.Wrapf(err, "eventstore: the inline projections ran at version %d of stream %q (expected %s), and another append to it committed first; retry",
		p.pinned, a.stream, a.exp)
}

// apply runs the inline projections over the events of a in tx, before a is
// appended. It reads the stream's version (without a lock: nothing here
// may wait for the log's ordering lock, nor make an append wait) and pins
// a's expected version to it, so that the versions the handlers saw are
// the versions stored: if another append to the stream commits first, a
// fails with ErrWrongExpectedVersion and the handlers' writes roll back
// with it.
func (r *inlineRun) apply(ctx context.Context, tx pgx.Tx, a *appendArgs) (inlinePlan, error) {
	in := r.s.inline
	if !in.wants(a) {
		return inlinePlan{pinned: -1}, nil
	}
	if a.events == nil {
		evs, err := decodePayload(a.payload)
		if err != nil {
			return inlinePlan{}, err
		}
		a.events = evs
	}
	plan := inlinePlan{pinned: -1}
	if a.callerIDs {
		plan.ids = make([]pgtype.UUID, len(a.events))
		for i, e := range a.events {
			plan.ids[i] = pgtype.UUID{Bytes: e.id, Valid: true}
		}
		var stored int
		if err := tx.QueryRow(ctx, r.s.q.storedIDs, plan.ids).Scan(&stored); err != nil {
			return inlinePlan{}, errors.Wrap(err, "eventstore: inline: look up event IDs")
		}
		if stored > 0 {
			return inlinePlan{stored: true, pinned: -1}, nil
		}
		plan.guard = true
	}
	cur, ok := r.versions[a.stream]
	if !ok {
		var state int16
		err := tx.QueryRow(ctx, r.s.q.streamVersion, a.stream).Scan(&cur, &state)
		if errors.Is(err, pgx.ErrNoRows) {
			cur, err = 0, nil
		}
		if err != nil {
			return inlinePlan{}, errors.Wrap(err, "eventstore: inline: read stream version")
		}
		// A deleted stream: refused here as append_events would refuse it
		// (the pinned expected version below would otherwise recreate it).
		if state == int16(StreamHardDeleted) || (state == int16(StreamSoftDeleted) && a.exp != Exact(cur)) {
			return inlinePlan{}, errors.WithStack(&StreamDeletedError{StreamID: a.stream, Version: cur, Hard: state == int16(StreamHardDeleted)})
		}
	}
	switch exp := a.exp; {
	case exp == StreamExists && cur == 0, exp >= NoStream && int64(exp) != cur:
		return inlinePlan{}, errors.WithStack(&WrongExpectedVersionError{StreamID: a.stream, Expected: exp, Actual: cur})
	}
	a.expected = cur // pinned: Any and StreamExists become the version read
	if a.exp == Any || a.exp == StreamExists {
		plan.pinned = cur
	}
	r.versions[a.stream] = cur + int64(len(a.events))
	for i, ev := range a.events {
		// A copy of the data: the append's payload is rendered from ev.data
		// after the handlers ran.
		e := Event{ID: ev.id, StreamID: a.stream, StreamVersion: cur + int64(i) + 1, Type: ev.typ,
			Data: append(json.RawMessage(nil), ev.data...)}
		if len(ev.meta) > 0 {
			if err := json.Unmarshal(ev.meta, &e.Metadata); err != nil {
				return inlinePlan{}, errors.Wrap(err, "eventstore: inline: decode metadata")
			}
		}
		ps := in.any
		if t := in.byType[ev.typ]; len(t) > 0 {
			ps = append(ps[:len(ps):len(ps)], t...)
		}
		for _, p := range ps {
			err := safely(func() error { return p.Handle(ctx, tx, e) })
			if err != nil {
				return inlinePlan{}, errors.WithStack(&InlineError{Projection: p.Name(), StreamID: a.stream,
					StreamVersion: e.StreamVersion, EventID: e.ID, Type: e.Type, Err: err})
			}
		}
	}
	return plan, nil
}

// safely calls fn, turning a panic into an error with its stack.
func safely(fn func() error) error { return recovered.Call("handler", fn) }

// queueGuard adds, after an inline append with caller-chosen IDs, the check
// that this transaction wrote every one of its events (not another that
// committed the same IDs after apply looked them up, which append_events
// would answer as an idempotent re-append while the handlers applied them
// here). It runs in the same pipeline as the append and the COMMIT, so it
// adds no round trip under the ordering lock, only an index probe per
// event; when it fails, the pipeline stops before the COMMIT.
func (s *Store) queueGuard(b *pgx.Batch, plan inlinePlan) {
	if plan.guard {
		b.Queue(s.q.inlineWritten, plan.ids, len(plan.ids))
	}
}

// guardError is the error of a failed InlineWritten check.
func guardError(err error) error {
	return errmark.Mark(errors.Wrap(err, ErrStoredConcurrently.Error()), ErrStoredConcurrently)
}

// decodePayload reads the JSON array of an EncodedAppend into events.
func decodePayload(payload []byte) ([]encodedEvent, error) {
	var raw []struct {
		ID       uuid.UUID       `json:"event_id"`
		Type     string          `json:"type"`
		Data     json.RawMessage `json:"data"`
		Metadata json.RawMessage `json:"metadata"`
	}
	if err := json.Unmarshal(payload, &raw); err != nil {
		return nil, invalidf("encoded append: %v", err)
	}
	out := make([]encodedEvent, len(raw))
	for i, r := range raw {
		out[i] = encodedEvent{id: r.ID, typ: r.Type, data: r.Data, meta: r.Metadata}
	}
	return out, nil
}

// appendInline appends a in a transaction of its own after applying the
// inline projections in it. A conflict that the caller's expected version
// did not ask for (Any or StreamExists pinned to the version read, or an
// event ID stored concurrently) is retried, up to inlineRetries times,
// after a random pause that doubles with each attempt (inlineBackoff).
//
// A retry first queues for a transaction-level advisory lock on the stream
// (inlineLockKey), and so does the first attempt of an Append to a stream
// that conflicted in this Store within the last second (hotStreams): the
// Appends to a hot stream then run their handlers one at a time instead of
// racing. Without the lock, sixteen writers appending to one stream made
// some append lose ten races in a row and fail; with it on retries only,
// first attempts still beat a retry about a third of the time (a review
// measured attempt 10 once in 21,000 appends). A stream without recent
// conflicts takes no lock on the first attempt, so an uncontended append
// pays nothing. The lock cannot deadlock against the log's ordering lock:
// it is the first thing the transaction does, and nothing waits for it
// while holding the ordering lock (apply runs before any append takes it).
func (s *Store) appendInline(ctx context.Context, a appendArgs) (AppendResult, error) {
	const inlineRetries = 10
	hot := &s.inline.hot
	for attempt := 1; ; attempt++ {
		res, err := s.appendInlineOnce(ctx, a, attempt > 1 || hot.is(a.stream, time.Now()))
		if errors.Is(err, errSentLost) {
			return res, s.inlineOutcomeUnknown(ctx, a, err)
		}
		if err != nil && ctx.Err() != nil && !answered(err) {
			// The context ended before the append and its COMMIT were
			// sent (sent, they would have been errSentLost above, or
			// answered): nothing was written, as an Append without
			// inline projections says.
			return res, errors.WithSecondaryError(notWritten(ctx.Err()), err)
		}
		if err == nil || attempt == inlineRetries || ctx.Err() != nil {
			return res, err
		}
		pinned := (a.exp == Any || a.exp == StreamExists) && errors.Is(err, ErrWrongExpectedVersion)
		if !pinned && !errors.Is(err, ErrStoredConcurrently) && !s.storedSince(ctx, a, err) {
			return res, err
		}
		hot.mark(a.stream, time.Now())
		t := time.NewTimer(inlineBackoff(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return res, err
		case <-t.C:
		}
	}
}

// inlineOutcomeUnknown is the *OutcomeUnknownError of inline append a,
// whose appends and COMMIT were sent and got no answer (errSentLost): it
// may have been written, and the caller learns how with its event IDs.
func (s *Store) inlineOutcomeUnknown(ctx context.Context, a appendArgs, err error) error {
	if a.events == nil {
		if evs, derr := decodePayload(a.payload); derr == nil {
			a.events = evs
		}
	}
	if cerr := ctx.Err(); cerr != nil {
		return outcomeUnknown(&a, errors.WithSecondaryError(cerr, err), cancelledSent)
	}
	return outcomeUnknown(&a, err, answerMissing)
}

// storedSince reports whether err, an inline projection's failure on
// append a with caller-chosen event IDs, came after some of those IDs were
// stored by another transaction: they were not stored when apply looked
// them up, and a handler then failed on what that transaction wrote (a read
// model row it waited for, keyed as its own is). That is how the retry of
// an outcome-unknown Append meets its first attempt, whose COMMIT the
// server ran late, after the retry's look-up. The attempt is then made
// again, as after ErrStoredConcurrently, and answers as an idempotent
// re-append (or ErrEventIDConflict), as it would had the first attempt
// committed before the look-up. The IDs are looked up again after the
// handler failed: a handler that waited for the other transaction's row
// failed only once that transaction ended.
func (s *Store) storedSince(ctx context.Context, a appendArgs, err error) bool {
	if !a.callerIDs || !errors.Is(err, ErrInlineProjection) {
		return false
	}
	evs := a.events
	if evs == nil {
		var derr error
		if evs, derr = decodePayload(a.payload); derr != nil {
			return false
		}
	}
	ids := make([]pgtype.UUID, len(evs))
	for i, e := range evs {
		ids[i] = pgtype.UUID{Bytes: e.id, Valid: true}
	}
	var stored int
	if qerr := s.pool.QueryRow(ctx, s.q.storedIDs, ids).Scan(&stored); qerr != nil {
		return false
	}
	return stored > 0
}

// inlineBackoff is the pause before retry attempt+1 of an inline append: a
// uniformly random duration below 1 ms·2^(attempt-1), capped at 64 ms.
// It spreads retries that would otherwise re-read the stream version in
// lock step with the writers they conflict with (Transact and AppendTx
// callers do not take the retry lock); the first retry waits under 1 ms,
// all nine under 0.26 s.
func inlineBackoff(attempt int) time.Duration {
	ceiling := time.Millisecond << min(attempt-1, 6)
	return max(rand.N(ceiling), time.Microsecond)
}

// inlineLockKey is the advisory-lock key that serializes the inline
// Appends that take it (retries, and first attempts on a hot stream) to one
// stream in one schema; the schema's inline_stream_lock (migration 0034)
// takes it, computed alike in SQL. The NUL separators keep it apart from
// every other annals lock key (subscriber partitions, setup, generations):
// those are built from PostgreSQL text, which cannot hold NUL, so no
// schema, subscriber or stream name can spell this one.
func inlineLockKey(schema, stream string) (int32, int32) {
	return lockkey.Pair("inline\x00" + schema + "\x00" + stream)
}

func (s *Store) appendInlineOnce(ctx context.Context, a appendArgs, serialize bool) (AppendResult, error) {
	for again := false; ; again = true {
		// READ COMMITTED whatever the session's default: under REPEATABLE
		// READ the snapshot would be taken by the lock statement, before
		// its wait, and every read after it would miss the commit it
		// waited for.
		res, err := s.transact(ctx, pgtx.ReadCommitted, func(ctx context.Context, tx pgx.Tx, b *Batch) error {
			if serialize {
				if err := s.lockInlineStream(ctx, tx, a.stream, again); err != nil {
					return err
				}
			}
			b.appends = append(b.appends, a)
			return nil
		})
		if errors.Is(err, lockfallback.ErrSwitched) && !again {
			continue // the lock statement was the transaction's first: nothing else is lost
		}
		if err != nil {
			return AppendResult{}, err
		}
		return res[0], nil
	}
}

// lockInlineStream queues tx (whose first statement this is) on the retry
// lock of inline appends to stream: through the schema's
// inline_stream_lock (migration 0034), or, on a schema migrated before it,
// through pg_advisory_xact_lock with the same key, as clients before 0034
// took it (internal/lockfallback). A failure that switches the choice
// returns lockfallback.ErrSwitched (the attempt is made again), unless last
// is set: then migrations.ErrNotMigrated.
func (s *Store) lockInlineStream(ctx context.Context, tx pgx.Tx, stream string, last bool) error {
	direct := s.inlineLock.Direct()
	var err error
	if direct {
		k1, k2 := inlineLockKey(s.schema, stream)
		_, err = tx.Exec(ctx, s.q.inlineStreamLockDirect, k1, k2)
	} else {
		_, err = tx.Exec(ctx, s.q.inlineStreamLock, stream)
	}
	if err == nil {
		return nil
	}
	return s.inlineLock.Failed(errors.Wrap(err, "eventstore: inline: queue for the stream's retry lock"), direct, last, "inline_stream_lock")
}
