package eventstore

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/annals-dev/annals/internal/pgtx"
)

// GroupCommit configures how Store.Append coalesces concurrent appends of a
// process into one transaction. See the package documentation ("Group
// commit") for the algorithm.
type GroupCommit struct {
	// Disabled makes every Append a transaction of its own
	// (append_events_json), as AppendTx in a transaction of its own would be.
	Disabled bool
	// MaxEvents bounds the events of one group; an append larger than it
	// still goes alone. Defaults to 400.
	MaxEvents int
	// MaxInFlight is how many groups a Store sends at once. Defaults to 2,
	// but a group beyond the first leaves only when at least ParallelEvents
	// events are queued: large appends then travel in several groups whose
	// client-side encoding and server-side checks overlap the commit of the
	// group ahead (4 writers × 100 events: 0.46× → 0.54–0.66× of raw inserts
	// in the same runs), while small appends keep waiting for one group, so
	// that all of them share its WAL flush (two groups of single events
	// measured slower: 16 writers 1.31× → 1.03× of raw inserts).
	MaxInFlight int
	// Linger is how long a finished group's successor waits, at most, for
	// the appenders just answered to queue again before it is sent (only
	// when other appends are already waiting; a lone append never waits).
	// After two lingers in a row that nobody joined, the next 8 groups of
	// small appends (fewer than ParallelEvents events) do not linger.
	// Defaults to 200µs; negative sends at once.
	Linger time.Duration
	// ParallelEvents is how many events must be queued for a group beyond
	// the first in flight to leave. Defaults to 200; negative: no minimum.
	ParallelEvents int
}

func (g GroupCommit) withDefaults() (GroupCommit, error) {
	if g.MaxEvents < 0 || g.MaxInFlight < 0 {
		return g, errors.New("eventstore: GroupCommit.MaxEvents and MaxInFlight must not be negative")
	}
	if g.MaxEvents == 0 {
		g.MaxEvents = 400
	}
	if g.MaxInFlight == 0 {
		g.MaxInFlight = 2
	}
	if g.ParallelEvents == 0 {
		g.ParallelEvents = 200
	}
	if g.Linger == 0 {
		g.Linger = 200 * time.Microsecond
	}
	return g, nil
}

// pendingAppend is one Append waiting for its group's outcome.
type pendingAppend struct {
	ctx  context.Context
	args appendArgs
	done chan struct{}
	// taken is set (under committer.mu) when a group took the append: from
	// then on its outcome is decided by that group's statement.
	taken bool
	res   AppendResult
	err   error
}

// committer coalesces concurrent Store.Append calls into calls of
// append_batch, each one statement and so one transaction: one round trip,
// one acquisition of the ordering lock and one WAL flush for the group.
type committer struct {
	s   *Store
	cfg GroupCommit

	mu       sync.Mutex
	queue    []*pendingAppend
	inFlight int
	// refill is closed when the queue reaches refillAt appends: a lingering
	// group (see run) need not wait any longer.
	refill   chan struct{}
	refillAt int
	// lingerSkips is how many more groups leave without lingering: set
	// after lingers that nobody joined (the appenders are paced, not in a
	// loop), so that they do not each pay the Linger (see run).
	// lingerMisses counts the lingers nobody joined since one was joined:
	// two in a row start the skipping (one alone may be a pause of looping
	// writers), and after the skipping one more does.
	lingerSkips  int
	lingerMisses int
	// arrivals counts the appends ever queued: a linger was joined when it
	// grew meanwhile.
	arrivals uint64
	// noAppendOne is set when the schema has no append_one (migrated before
	// 0018): lone appends then go through append_batch too.
	noAppendOne atomic.Bool
	// untyped is set when the pool sends arguments without knowing the
	// parameters' types (QueryExecModeExec, QueryExecModeSimpleProtocol):
	// pgx then picks a type from the Go value, and []byte would go as bytea.
	untyped bool
	// prepare is set when the pool caches prepared statements
	// (QueryExecModeCacheStatement): append_batch is then prepared on each
	// connection, and sent unnamed otherwise (see execBatch).
	prepare bool
}

// newCommitter returns the committer of s.
func newCommitter(s *Store, cfg GroupCommit) *committer {
	return &committer{s: s, cfg: cfg,
		untyped: s.mode == pgx.QueryExecModeExec || s.mode == pgx.QueryExecModeSimpleProtocol,
		prepare: s.mode == pgx.QueryExecModeCacheStatement}
}

// lingerBackoff is how many groups go without lingering after lingers that
// nobody joined; then lingering is tried again.
const lingerBackoff = 8

// append runs one append through a group and returns its own outcome.
func (c *committer) append(ctx context.Context, args appendArgs) (AppendResult, error) {
	if err := ctx.Err(); err != nil {
		// Ended already: not queued, so never sent (a caller with a free
		// slot would otherwise send its own group).
		return AppendResult{}, notWritten(err)
	}
	p := &pendingAppend{ctx: ctx, args: args, done: make(chan struct{})}
	c.mu.Lock()
	c.queue = append(c.queue, p)
	c.arrivals++
	if c.refill != nil && len(c.queue) >= c.refillAt {
		close(c.refill)
		c.refill = nil
	}
	group := c.takeLocked()
	c.mu.Unlock()
	switch {
	case group == nil:
	case len(group) == 1 && group[0] == p:
		// This caller has a free slot and its append goes alone: it sends
		// it itself, which saves a hand-over to another goroutine when
		// appends are not concurrent. The statement ends with ctx (it has
		// no other member), so this returns at ctx's end.
		c.run(group)
	default:
		// A group of others too (or of others only): it goes on when
		// this caller's ctx ends, and the caller must not wait for it
		// then. It waits for its own outcome as the other members do.
		go c.run(group)
	}
	select {
	case <-p.done:
		return p.res, p.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	if !p.taken {
		if i := slices.Index(c.queue, p); i >= 0 {
			c.queue = slices.Delete(c.queue, i, i+1)
		}
		c.mu.Unlock()
		return AppendResult{}, notWritten(ctx.Err())
	}
	c.mu.Unlock()
	// The group is on its way: its outcome is the append's. Wait for it if
	// it is already known, else report that it is unknown.
	select {
	case <-p.done:
		return p.res, p.err
	default:
		return AppendResult{}, outcomeUnknown(&p.args, ctx.Err(), maybeWritten)
	}
}

// goneErr is the answer of an append whose caller's context ended while
// its statement was on its way and failed with err: the outcome is unknown,
// unless err says the statement was never sent. It matches the caller's
// own context error (a deadline, say), not the cancellation of the group's
// statement that followed from it.
func goneErr(p *pendingAppend, err error) error {
	if cerr := p.ctx.Err(); cerr != nil && !unsent(err) {
		return outcomeUnknown(&p.args, errors.WithSecondaryError(cerr, err), maybeWritten)
	}
	return failedErr(p.ctx, &p.args, err)
}

// takeLocked takes the next group from the queue if a slot is free: the
// oldest appends, skipping (and leaving queued, in place) any whose stream is
// already in the group or whose caller-chosen event ID is, up to MaxEvents.
// It returns nil when no slot is free or nothing is queued.
func (c *committer) takeLocked() []*pendingAppend {
	if len(c.queue) == 0 || c.inFlight >= c.cfg.MaxInFlight {
		return nil
	}
	if c.inFlight > 0 && c.cfg.ParallelEvents > 0 { // a second group: only for many events
		queued := 0
		for _, p := range c.queue {
			queued += p.args.count
		}
		if queued < c.cfg.ParallelEvents {
			return nil
		}
	}
	var (
		group   []*pendingAppend
		events  int
		streams = make(map[string]struct{}, len(c.queue))
		ids     map[uuid.UUID]struct{}
	)
	rest := c.queue[:0]
	for i, p := range c.queue {
		if events >= c.cfg.MaxEvents {
			rest = append(rest, c.queue[i:]...)
			break
		}
		if p.ctx.Err() != nil {
			// Its caller has gone: it takes it out of the queue itself
			// (append), with nothing written.
			rest = append(rest, p)
			continue
		}
		if _, dup := streams[p.args.stream]; dup || (len(group) > 0 && events+p.args.count > c.cfg.MaxEvents) ||
			(p.args.callerIDs && sharesID(ids, p.args.events)) {
			rest = append(rest, p)
			continue
		}
		streams[p.args.stream] = struct{}{}
		if p.args.callerIDs {
			if ids == nil {
				ids = make(map[uuid.UUID]struct{})
			}
			for _, e := range p.args.events {
				ids[e.id] = struct{}{}
			}
		}
		p.taken = true
		group = append(group, p)
		events += p.args.count
	}
	clear(c.queue[len(rest):])
	c.queue = rest
	if len(group) == 0 {
		return nil // every queued caller has gone: no group, no slot taken
	}
	c.inFlight++
	return group
}

func sharesID(ids map[uuid.UUID]struct{}, events []encodedEvent) bool {
	for _, e := range events {
		if _, ok := ids[e.id]; ok {
			return true
		}
	}
	return false
}

// run sends a group, hands each member its outcome, and starts the next
// group if appends are waiting.
func (c *committer) run(group []*pendingAppend) {
	c.send(group)
	for _, p := range group {
		close(p.done)
	}
	c.mu.Lock()
	events := 0
	for _, p := range group {
		events += p.args.count
	}
	small := c.cfg.ParallelEvents <= 0 || events < c.cfg.ParallelEvents
	if (len(c.queue) == 0 && len(group) == 1) || c.cfg.Linger <= 0 || (small && c.skipLingerLocked()) {
		c.inFlight--
		next := c.takeLocked()
		c.mu.Unlock()
		if next != nil {
			go c.run(next)
		}
		return
	}
	// Appends are waiting, or this group had several members. The members
	// just answered are likely to append again at once (writers in a
	// loop): give them up to Linger to queue, so that they travel in the
	// next group instead of the one after it. Without this, a steady set of
	// writers splits into cohorts that take turns (measured with 16
	// writers: groups of 1 and 16 alternating, or of 8 and 8). The slot
	// stays reserved meanwhile, so newcomers queue too. A lone appender
	// (a group of one, nobody waiting) never waits. Appenders that are
	// paced rather than looping (requests arriving on their own) do not
	// come back within Linger: when nobody joins two lingers in a row of
	// groups of small appends (fewer than ParallelEvents events), the next
	// lingerBackoff such groups leave at once (skipLingerLocked), and the
	// one after them tries again (one more miss skips again). Writers of
	// large appends in a loop may take longer than Linger to encode their
	// next one; their groups always linger, as lingering keeps them large.
	want := len(c.queue) + len(group)
	arrivals := c.arrivals
	refill := make(chan struct{})
	if c.refill != nil { // two groups in flight, both lingering: wake the first one now
		close(c.refill)
	}
	c.refill, c.refillAt = refill, want
	c.mu.Unlock()
	go func() {
		t := time.NewTimer(c.cfg.Linger)
		select {
		case <-refill:
		case <-t.C:
		}
		t.Stop()
		c.mu.Lock()
		if c.refill == refill { // another group may linger now, with a refill of its own
			c.refill = nil
		}
		switch {
		case c.arrivals != arrivals: // somebody queued during the linger
			c.lingerSkips, c.lingerMisses = 0, 0
		case small:
			if c.lingerMisses++; c.lingerMisses >= 2 {
				c.lingerSkips, c.lingerMisses = lingerBackoff, 1
			}
		}
		c.inFlight--
		next := c.takeLocked()
		c.mu.Unlock()
		if next != nil {
			c.run(next)
		}
	}()
}

// skipLingerLocked reports whether the group now finishing leaves its
// successor without lingering (see run), and counts it.
func (c *committer) skipLingerLocked() bool {
	if c.lingerSkips == 0 {
		return false
	}
	c.lingerSkips--
	return true
}

// send runs append_batch for the group. Its context ends when every member's
// context has ended: nobody is left waiting for the outcome.
func (c *committer) send(group []*pendingAppend) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(group[0].ctx))
	defer cancel()
	waiting := int32(len(group))
	for _, p := range group {
		stop := context.AfterFunc(p.ctx, func() {
			if atomic.AddInt32(&waiting, -1) == 0 {
				cancel()
			}
		})
		defer stop()
	}

	err := c.sendGroup(ctx, group)
	for tries := 1; pgtx.Retryable(err) && tries < serializationRetries && ctx.Err() == nil; tries++ {
		// The group's statement was a transaction of its own and failed
		// to serialize: nothing of it committed (see serializationRetries).
		for _, p := range group {
			p.res, p.err = AppendResult{}, nil
		}
		err = c.sendGroup(ctx, group)
	}
	if err == nil {
		return
	}
	if ctx.Err() != nil {
		// Every member's context ended, and the statement was cancelled
		// (or its connection closed) on its way: it may have committed.
		for _, p := range group {
			p.res, p.err = AppendResult{}, goneErr(p, err)
		}
		return
	}
	if len(group) == 1 && !uniqueViolation(err) {
		p := group[0]
		p.res, p.err = AppendResult{}, failedErr(p.ctx, &p.args, err)
		return
	}
	// The group as a whole failed (not one append's expected version or
	// event IDs: those are answered per append), or a lone append met a
	// unique violation. Send each append alone through append_events_json, so
	// that each gets its own outcome and a bad one cannot fail the others.
	// Should the group have committed after all (a connection lost after
	// COMMIT), re-sending is harmless: an append of stored event IDs is an
	// idempotent re-append. The unique violation of a lone append is the
	// race of a retry with its original: another append of its
	// caller-chosen IDs committed while it waited for the ordering lock,
	// after append_one or append_batch had looked its IDs up (their
	// look-up under the lock would cost every append; docs/sql-api.md).
	// append_events_json looks them up under the lock and answers the stored
	// positions (or ErrEventIDConflict).
	for _, p := range group {
		p.res, p.err = c.s.appendAlone(ctx, p.args)
		switch {
		case p.err == nil:
		case unsent(p.err) && answerLost(err):
			// Neither the group's statement nor the re-send was answered
			// (the re-send never left): the group may have committed it.
			p.err = failedErr(p.ctx, &p.args, errors.WithSecondaryError(err, p.err))
		case ctx.Err() != nil:
			p.err = goneErr(p, p.err)
		default:
			p.err = failedErr(p.ctx, &p.args, p.err)
		}
	}
}

// serializationRetries bounds how many times an append's own transaction
// (a group's statement, a lone append) is sent in all when it fails to
// serialize. Each failure means another append to one of its streams
// committed while it waited for the ordering lock, so the writers make
// progress; the bound is for a stream that many processes append to at
// once.
//
// Append's functions fail to serialize only under a session whose
// default_transaction_isolation is REPEATABLE READ or SERIALIZABLE: an
// append's snapshot is taken when its statement starts, before its wait for
// the ordering lock, and its update of a stream's row that another append
// changed meanwhile fails to serialize (40001). The statement (or the
// transaction Append began) then committed nothing, and is sent again
// (pgtx.Retryable, which takes a deadlock too): its new snapshot sees the
// other append, and the append answers as under READ COMMITTED (a wrong
// expected version, an idempotent re-append).
const serializationRetries = 20

// uniqueViolation reports whether err is a unique violation (23505): from
// append_one or append_batch, an event ID stored while the call waited for
// the ordering lock (see send).
func uniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// appendRefused returns the error of an append that append_batch or
// append_one answered with a status other than written (0) or stored already
// (3), or, as its second result, the failure of a status it does not know.
func appendRefused(stream string, exp ExpectedVersion, status int16, actual *int64) (refused, failed error) {
	var version int64
	if actual != nil {
		version = *actual
	}
	switch status {
	case 1:
		return errors.WithStack(&WrongExpectedVersionError{StreamID: stream, Expected: exp, Actual: version}), nil
	case 4, 5: // deleted, hard-deleted
		return errors.WithStack(&StreamDeletedError{StreamID: stream, Version: version, Hard: status == 5}), nil
	case 2:
		return errors.Wrapf(ErrEventIDConflict,
			"annals: some events of the append to stream %q are already stored with other content, or only some of them are", stream), nil
	default:
		return nil, errors.Newf("eventstore: the append function returned unknown status %d", status)
	}
}

// sendOne sends a group of one single-event append through append_one: the
// same rules and outcomes as append_batch, with scalar arguments and one
// result row (a lone append's server CPU, docs/benchmarks.md).
func (c *committer) sendOne(ctx context.Context, p *pendingAppend) error {
	var expected *int64
	if v, ok := p.args.expected.(int64); ok {
		expected = &v
	}
	e := p.args.events[0]
	var (
		status         int16
		seq, ver, actu pgtype.Int8 // scanned without allocation
	)
	// pgtype.UUID, not uuid.UUID: pgx encodes a uuid.UUID through its
	// driver.Valuer (a string, parsed again); nor [16]byte, which pgx can
	// encode only knowing the parameter's type, that is, not in
	// QueryExecModeExec or QueryExecModeSimpleProtocol.
	var data, meta any = e.data, e.meta // as they are: no copy into a string
	if c.untyped {
		data, meta = string(e.data), nil
		if e.meta != nil {
			meta = string(e.meta)
		}
	}
	err := c.s.pool.QueryRow(ctx, c.s.q.appendOne, append(c.s.loneMode, p.args.stream, expected, pgtype.UUID{Bytes: e.id, Valid: true}, e.typ, data, meta, p.args.callerIDs)...).
		Scan(&status, &seq, &ver, &actu)
	if err != nil {
		return translate(err, p.args.stream, p.args.exp)
	}
	if status == 0 || status == 3 {
		if !seq.Valid || !ver.Valid {
			return errors.New("eventstore: append_one returned an event without a position")
		}
		p.res = AppendResult{StreamID: p.args.stream, StreamVersion: ver.Int64,
			Events: []AppendedEvent{{ID: e.id, GlobalSequence: seq.Int64, StreamVersion: ver.Int64}}}
		return nil
	}
	var actual *int64
	if actu.Valid {
		actual = &actu.Int64
	}
	var failed error
	p.res = AppendResult{}
	p.err, failed = appendRefused(p.args.stream, p.args.exp, status, actual)
	return failed
}

// sendGroup sends the group through append_one when it is one single-event
// append, else through append_batch.
func (c *committer) sendGroup(ctx context.Context, group []*pendingAppend) error {
	if len(group) == 1 && group[0].args.count == 1 && len(group[0].args.events) == 1 && !c.noAppendOne.Load() {
		err := c.sendOne(ctx, group[0])
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42883" {
			return err
		}
		// A schema migrated before append_one (0018): this client was
		// deployed before `annals migrate` ran. append_batch does the
		// same, for the life of this Store.
		c.noAppendOne.Store(true)
	}
	return c.sendBatch(ctx, group)
}

// sendBatch sends one append_batch statement and distributes its rows.
func (c *committer) sendBatch(ctx context.Context, group []*pendingAppend) error {
	n := 0
	check := false
	byStream := make(map[string]*pendingAppend, len(group))
	for _, p := range group {
		n += p.args.count
		check = check || p.args.callerIDs
		byStream[p.args.stream] = p
		p.res = AppendResult{StreamID: p.args.stream, Events: make([]AppendedEvent, 0, p.args.count)}
	}
	row := func(r *batchRow) error {
		p := byStream[string(r.stream)]
		if p == nil {
			return errors.Newf("eventstore: append_batch answered for stream %q, which the group does not hold", string(r.stream))
		}
		if r.status == 0 || r.status == 3 {
			if !r.seq.Valid || !r.ver.Valid || !r.id.Valid {
				return errors.New("eventstore: append_batch returned an event without its ID or position")
			}
			p.res.Events = append(p.res.Events, AppendedEvent{ID: r.id.Bytes, GlobalSequence: r.seq.Int64, StreamVersion: r.ver.Int64})
			return nil
		}
		var actual *int64
		if r.actu.Valid {
			actual = &r.actu.Int64
		}
		var err error
		p.err, err = appendRefused(p.args.stream, p.args.exp, r.status, actual)
		return err
	}
	if err := c.execBatch(ctx, encodeBatch(group, n, check), row); err != nil {
		return err
	}
	for _, p := range group {
		if p.err != nil {
			p.res = AppendResult{}
			continue
		}
		if len(p.res.Events) != p.args.count {
			return errors.Newf("eventstore: append_batch returned %d rows for the %d events of the append to %q",
				len(p.res.Events), p.args.count, p.args.stream)
		}
		slices.SortFunc(p.res.Events, func(a, b AppendedEvent) int { return cmp.Compare(a.StreamVersion, b.StreamVersion) })
		p.res.StreamVersion = p.res.Events[len(p.res.Events)-1].StreamVersion
	}
	return nil
}
