package projection_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// The helpers of the delivery tests (live, restart, fencing). They are
// methods of liveHarness, or carry a distinctive name, so that they do not
// collide with the helpers of the other test files of this package.

// liveHarness is a migrated database with the read model "seen": one row per
// applied event. Its primary key and the unique event ID make a second
// application of an event fail loudly; applied records the order of
// application.
type liveHarness struct {
	t     *testing.T
	pool  *pgxpool.Pool
	store *eventstore.Store
}

const seenSchema = `
CREATE TABLE seen (
    global_sequence bigint PRIMARY KEY,
    event_id        uuid   NOT NULL UNIQUE,
    stream_id       text   NOT NULL,
    stream_version  bigint NOT NULL,
    applied         bigserial NOT NULL,
    writer          text   NOT NULL
);
CREATE TABLE side (id bigserial PRIMARY KEY, note text);`

// newLiveHarness returns a harness on a fresh database of the test server.
func newLiveHarness(t *testing.T) *liveHarness {
	t.Helper()
	return liveHarnessOn(t, annalstest.NewDB(t, nil).Pool)
}

// liveHarnessOn sets up the read model in the database of pool.
func liveHarnessOn(t *testing.T, pool *pgxpool.Pool) *liveHarness {
	t.Helper()
	store, err := eventstore.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, seenSchema); err != nil {
		t.Fatal(err)
	}
	return &liveHarness{t: t, pool: pool, store: store}
}

// testConfig is a runner configuration with short retry intervals and the
// given poll interval.
func testConfig(poll time.Duration) *projection.Config {
	return &projection.Config{
		PollInterval:      poll,
		LockRetryInterval: 200 * time.Millisecond,
		RetryBackoff:      50 * time.Millisecond,
		ShutdownTimeout:   5 * time.Second,
	}
}

// run runs r in the background until the returned stop is called (or the
// test ends). stop cancels Run's context and fails the test unless Run
// returns nil within 15 s.
func (h *liveHarness) run(r *projection.Runner) (stop func()) { return runInBackground(h.t, r) }

// runInBackground runs r until the returned stop is called or t ends; stop
// fails t unless Run returns nil within 15 s.
func runInBackground(t testing.TB, r *projection.Runner) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("Run did not return 15 s after its context ended")
			}
		})
	}
	t.Cleanup(stop) // before the pool closes: cleanups run last-in first-out
	return stop
}

// newRunner returns a runner with handlers registered (with opts).
func (h *liveHarness) newRunner(cfg *projection.Config, opts *projection.Options, handlers ...any) *projection.Runner {
	h.t.Helper()
	r, err := projection.NewRunner(h.pool, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, handler := range handlers {
		if err := r.Register(handler, opts); err != nil {
			h.t.Fatal(err)
		}
	}
	return r
}

// movedEvent returns an event of type "acct.moved" with a fresh ID.
func movedEvent(n int) eventstore.EventData {
	return eventstore.EventData{ID: uuid.New(), Type: "acct.moved", Data: map[string]int{"n": n}}
}

// appendEvents appends n events one at a time, round robin over streams
// streams "acct-0"…, and returns the position of the last one.
func (h *liveHarness) appendEvents(n, streams int) int64 {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var last int64
	for i := range n {
		res, err := h.store.Append(ctx, fmt.Sprintf("acct-%d", i%streams), eventstore.Any, movedEvent(i))
		if err != nil {
			h.t.Fatal(err)
		}
		last = res.Events[0].GlobalSequence
	}
	return last
}

func (h *liveHarness) query(sql string, args ...any) int64 {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var v int64
	if err := h.pool.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
		h.t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func (h *liveHarness) head() int64 {
	h.t.Helper()
	return h.query(`SELECT coalesce(max(global_sequence), 0) FROM annals.events`)
}

// checkpoint returns the subscriber's checkpoint position (-1 without a row).
func (h *liveHarness) checkpoint(sub string) int64 {
	h.t.Helper()
	return h.query(`SELECT coalesce((SELECT position FROM annals.checkpoints WHERE subscriber_id = $1 AND partition = 0), -1)`, sub)
}

func (h *liveHarness) epoch(sub string) int64 {
	h.t.Helper()
	return h.query(`SELECT coalesce((SELECT epoch FROM annals.checkpoints WHERE subscriber_id = $1 AND partition = 0), -1)`, sub)
}

func (h *liveHarness) seenCount() int64 {
	h.t.Helper()
	return h.query(`SELECT count(*) FROM seen`)
}

func (h *liveHarness) isSeen(pos int64) bool {
	h.t.Helper()
	return h.query(`SELECT count(*) FROM seen WHERE global_sequence = $1`, pos) == 1
}

// waitCaughtUp waits until every subscriber's checkpoint is the head.
func (h *liveHarness) waitCaughtUp(timeout time.Duration, subs ...string) {
	h.t.Helper()
	head := h.head()
	for _, sub := range subs {
		annalstest.WaitFor(h.t, timeout, func() bool { return h.checkpoint(sub) == head })
	}
}

// checkSeenIsLog fails the test unless seen holds every event of the log
// exactly once and nothing else, applied in position order, with each
// stream's versions contiguous, and the subscriber's checkpoint is the head.
func (h *liveHarness) checkSeenIsLog(sub string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := h.pool.Query(ctx, `
		SELECT coalesce(e.global_sequence, s.global_sequence), e.event_id::text, s.event_id::text
		  FROM annals.events e FULL JOIN seen s USING (global_sequence)
		 WHERE e.event_id IS DISTINCT FROM s.event_id OR e.stream_id IS DISTINCT FROM s.stream_id
		    OR e.stream_version IS DISTINCT FROM s.stream_version
		 ORDER BY 1 LIMIT 10`)
	if err != nil {
		h.t.Fatal(err)
	}
	var pos int64
	var inLog, inSeen *string
	var diffs []string
	if _, err := pgx.ForEachRow(rows, []any{&pos, &inLog, &inSeen}, func() error {
		diffs = append(diffs, fmt.Sprintf("position %d: log %v, seen %v", pos, deref(inLog), deref(inSeen)))
		return nil
	}); err != nil {
		h.t.Fatal(err)
	}
	if len(diffs) > 0 {
		h.t.Errorf("seen differs from the log:\n%s", strings.Join(diffs, "\n"))
	}
	if n := h.query(`SELECT count(*) FROM (SELECT global_sequence, lag(global_sequence) OVER (ORDER BY applied) AS prev FROM seen) x
		WHERE prev >= global_sequence`); n != 0 {
		h.t.Errorf("%d events applied after a later position", n)
	}
	if n := h.query(`SELECT count(*) FROM (SELECT stream_version, lag(stream_version, 1, 0::bigint) OVER (PARTITION BY stream_id ORDER BY global_sequence) AS prev FROM seen) x
		WHERE stream_version <> prev + 1`); n != 0 {
		h.t.Errorf("%d events whose stream version does not follow the previous one's", n)
	}
	if cp, head := h.checkpoint(sub), h.head(); cp != head {
		h.t.Errorf("checkpoint of %s is %d, head %d", sub, cp, head)
	}
}

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

// seenProjection inserts every event into seen, with writer. before, if
// set, runs first.
type seenProjection struct {
	name   string
	writer string
	before func(ctx context.Context, e eventstore.Event) error
	dupes  atomic.Int64 // unique violations: an event applied twice
	errs   atomic.Int64 // failed inserts, duplicates included
}

func (p *seenProjection) Name() string { return p.name }

func (p *seenProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if p.before != nil {
		if err := p.before(ctx, e); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO seen (global_sequence, event_id, stream_id, stream_version, writer) VALUES ($1, $2, $3, $4, $5)`,
		e.GlobalSequence, e.ID, e.StreamID, e.StreamVersion, p.writer)
	if err != nil {
		p.errs.Add(1)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		p.dupes.Add(1)
	}
	return err
}

func (p *seenProjection) checkNoDupes(t *testing.T) {
	t.Helper()
	if n := p.dupes.Load(); n != 0 {
		t.Errorf("projection %s tried to apply %d events a second time", p.name, n)
	}
}

// deliveryLog is an observer that records its deliveries in memory.
type deliveryLog struct {
	name string
	mu   sync.Mutex
	got  []eventstore.Event
}

func (o *deliveryLog) Name() string { return o.name }

func (o *deliveryLog) Handle(_ context.Context, e eventstore.Event) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, e)
	return nil
}

func (o *deliveryLog) deliveries() []eventstore.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]eventstore.Event(nil), o.got...)
}

// checkAtLeastOnceInOrder fails the test unless every event of the log was
// delivered, nothing else was, and each stream's deliveries never skip a
// version (a re-delivery may go back, never forward past a gap). It returns
// the number of re-deliveries.
func (h *liveHarness) checkAtLeastOnceInOrder(o *deliveryLog) int {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logged := map[uuid.UUID]eventstore.Event{}
	for e, err := range h.store.ReadAll(ctx, 0) {
		if err != nil {
			h.t.Fatal(err)
		}
		logged[e.ID] = e
	}
	delivered := map[uuid.UUID]int{}
	maxVersion := map[string]int64{}
	redelivered := 0
	for _, e := range o.deliveries() {
		l, ok := logged[e.ID]
		if !ok {
			h.t.Fatalf("observer %s got event %s (position %d), which is not in the log", o.name, e.ID, e.GlobalSequence)
		}
		if l.GlobalSequence != e.GlobalSequence || l.StreamID != e.StreamID || l.StreamVersion != e.StreamVersion {
			h.t.Fatalf("observer %s got %+v for logged %+v", o.name, e, l)
		}
		if e.StreamVersion > maxVersion[e.StreamID]+1 {
			h.t.Fatalf("observer %s: stream %s version %d delivered after version %d", o.name, e.StreamID, e.StreamVersion, maxVersion[e.StreamID])
		}
		maxVersion[e.StreamID] = max(maxVersion[e.StreamID], e.StreamVersion)
		if delivered[e.ID]++; delivered[e.ID] > 1 {
			redelivered++
		}
	}
	for id, e := range logged {
		if delivered[id] == 0 {
			h.t.Fatalf("observer %s never got event %d (%s, stream %s v%d)", o.name, e.GlobalSequence, id, e.StreamID, e.StreamVersion)
		}
	}
	return redelivered
}

// TestCatchUpThenLive is the contract's items 2, 4 and 5 for the runner:
// events appended before the runner starts, while it catches up and after it
// is live are all applied once, in order; with many concurrent writers
// (rolling back some of their appends) too; and the live tail is woken by
// NOTIFY, not by the poll.
func TestCatchUpThenLive(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) (*liveHarness, *seenProjection) {
		t.Helper()
		return newLiveHarness(t), &seenProjection{name: "seen"}
	}

	t.Run("BeforeDuringAfter", func(t *testing.T) {
		t.Parallel()
		h, p := setup(t)
		h.appendEvents(250, 5) // before

		// The first batch of the catch-up is held open until more events
		// are committed: those are appended during the catch-up.
		entered, gate := make(chan struct{}), make(chan struct{})
		var once sync.Once
		p.before = func(ctx context.Context, _ eventstore.Event) error {
			once.Do(func() {
				close(entered)
				select {
				case <-gate:
				case <-ctx.Done():
				}
			})
			return nil
		}
		const poll = 10 * time.Second
		stop := h.run(h.newRunner(testConfig(poll), &projection.Options{BatchSize: 40}, p))
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the runner did not start catching up")
		}
		during := h.appendEvents(150, 7)
		if cp := h.checkpoint("seen"); cp >= during {
			t.Fatalf("checkpoint %d: the catch-up was over before the events up to %d were appended", cp, during)
		}
		close(gate)
		h.waitCaughtUp(15*time.Second, "seen")

		// Live: each event is applied long before the poll interval is up,
		// so the tail was woken by its NOTIFY.
		var slowest time.Duration
		for i := range 10 {
			start := time.Now()
			pos := h.appendEvents(1, 3+i)
			annalstest.WaitFor(t, poll/2, func() bool { return h.isSeen(pos) })
			slowest = max(slowest, time.Since(start))
		}
		t.Logf("live delivery: slowest of 10 took %v (poll interval %v)", slowest, poll)
		stop()
		h.checkSeenIsLog("seen")
		p.checkNoDupes(t)
		if n := h.seenCount(); n != 410 {
			t.Fatalf("seen has %d events, want 410", n)
		}
	})

	// The writers of eventstore's ordering test run while the runner is
	// live: a transactional projection and an observer on one runner (one
	// listener) receive every committed event and no rolled-back one, in
	// order, while an unrelated long write transaction stays open.
	t.Run("ConcurrentWriters", func(t *testing.T) {
		t.Parallel()
		h, p := setup(t)
		obs := &deliveryLog{name: "observer"}
		h.appendEvents(200, 10)
		r := h.newRunner(testConfig(10*time.Second), &projection.Options{BatchSize: 50, CheckpointEvery: 20}, p, obs)
		stop := h.run(r)

		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		longTx, err := h.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = longTx.Rollback(context.Background()) }()
		if _, err := longTx.Exec(ctx, `INSERT INTO side (note) VALUES ('long transaction')`); err != nil {
			t.Fatal(err)
		}

		runFor := 3 * time.Second
		if testing.Short() {
			runFor = time.Second
		}
		w := runChurn(ctx, h, 16, runFor)
		before := h.seenCount()
		annalstest.WaitFor(t, 20*time.Second, func() bool { return h.seenCount() > before+100 })
		var open bool
		if err := longTx.QueryRow(ctx, `SELECT true`).Scan(&open); err != nil || !open {
			t.Fatalf("the long transaction was not open while the projection progressed: %v", err)
		}
		if err := w.wait(); err != nil {
			t.Fatal(err)
		}
		if err := longTx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		h.waitCaughtUp(20*time.Second, "seen", "observer")
		stop()

		committed, rolledBack := w.outcome()
		t.Logf("%d committed and %d rolled-back events from %d writers, head %d", len(committed), len(rolledBack), 16, h.head())
		if len(committed) < 200 || len(rolledBack) == 0 {
			t.Fatalf("workload too small to prove anything: %d committed, %d rolled back", len(committed), len(rolledBack))
		}
		h.checkSeenIsLog("seen")
		p.checkNoDupes(t)
		ids := map[uuid.UUID]bool{}
		rows, err := h.pool.Query(ctx, `SELECT event_id FROM seen`)
		if err != nil {
			t.Fatal(err)
		}
		var id uuid.UUID
		if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { ids[id] = true; return nil }); err != nil {
			t.Fatal(err)
		}
		for id := range committed {
			if !ids[id] {
				t.Fatalf("committed event %s is not in seen", id)
			}
		}
		for id := range rolledBack {
			if ids[id] {
				t.Fatalf("rolled-back event %s is in seen", id)
			}
		}
		if n := h.checkAtLeastOnceInOrder(obs); n > 0 {
			t.Logf("observer: %d re-deliveries", n)
		}
	})
}

// churn is a running workload of concurrent writers (see runChurn).
type churn struct {
	wg   sync.WaitGroup
	errs chan error

	mu         sync.Mutex
	committed  map[uuid.UUID]string
	rolledBack map[uuid.UUID]bool
}

// runChurn starts the randomized writers of eventstore's ordering test:
// transactions that write another table first and take time, append to one
// or two streams, stay open after appending, or roll back (~10%).
func runChurn(ctx context.Context, h *liveHarness, writers int, runFor time.Duration) *churn {
	c := &churn{errs: make(chan error, writers), committed: map[uuid.UUID]string{}, rolledBack: map[uuid.UUID]bool{}}
	deadline := time.Now().Add(runFor)
	for w := range writers {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for time.Now().Before(deadline) && ctx.Err() == nil {
				err := c.writeOnce(ctx, h, rng)
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "40001" {
					continue // a serialization failure rolled back; callers retry
				}
				if err != nil {
					c.errs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
			}
		}()
	}
	return c
}

// wait waits for the writers and returns the first error.
func (c *churn) wait() error {
	c.wg.Wait()
	close(c.errs)
	return <-c.errs
}

func (c *churn) outcome() (committed map[uuid.UUID]string, rolledBack map[uuid.UUID]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.committed, c.rolledBack
}

func (c *churn) record(ids map[uuid.UUID]string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, s := range ids {
		if ok {
			c.committed[id] = s
		} else {
			c.rolledBack[id] = true
		}
	}
}

func (c *churn) writeOnce(ctx context.Context, h *liveHarness, rng *rand.Rand) error {
	stream := func() string { return fmt.Sprintf("acct-%d", rng.IntN(40)) }
	events := func() []eventstore.EventData {
		out := make([]eventstore.EventData, 1+rng.IntN(3))
		for i := range out {
			out[i] = movedEvent(rng.IntN(100))
		}
		return out
	}
	ids := map[uuid.UUID]string{}
	note := func(s string, es []eventstore.EventData) {
		for _, e := range es {
			ids[e.ID] = s
		}
	}
	// The sleeps below are the workload (work inside a transaction), not
	// waits for a condition.
	pause := func(d time.Duration) { time.Sleep(time.Duration(rng.Int64N(int64(d)))) }

	switch rng.IntN(10) {
	case 0: // an append in its own transaction
		s, es := stream(), events()
		note(s, es)
		_, err := h.store.Append(ctx, s, eventstore.Any, es...)
		c.record(ids, err == nil)
		return err
	case 1: // work, then appends and COMMIT in one round trip
		_, err := h.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
			if _, err := tx.Exec(ctx, `INSERT INTO side (note) VALUES ('transact')`); err != nil {
				return err
			}
			pause(3 * time.Millisecond)
			s, es := stream(), events()
			note(s, es)
			return batch.Append(s, eventstore.Any, es...)
		})
		c.record(ids, err == nil)
		return err
	}

	tx, err := h.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if rng.IntN(3) == 0 { // write another table first and take time
		if _, err := tx.Exec(ctx, `INSERT INTO side (note) VALUES ('before append')`); err != nil {
			return err
		}
		pause(5 * time.Millisecond)
	}
	for range 1 + rng.IntN(2) { // one or two streams
		s, es := stream(), events()
		note(s, es)
		if _, err := h.store.AppendTx(ctx, tx, s, eventstore.Any, es...); err != nil {
			c.record(ids, false)
			return err
		}
	}
	if rng.IntN(4) == 0 { // stay open after appending
		pause(3 * time.Millisecond)
	}
	if rng.IntN(10) == 0 { // roll back
		c.record(ids, false)
		return tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		c.record(ids, false)
		return err
	}
	c.record(ids, true)
	return nil
}

// TestListenerConnectionKilled: when the process's LISTEN connection dies,
// the listener reconnects and wakes every subscriber, so events appended
// meanwhile are delivered within seconds, not at the next poll (30 s here).
func TestListenerConnectionKilled(t *testing.T) {
	t.Parallel()
	const poll = 30 * time.Second

	setup := func(t *testing.T) (*liveHarness, *seenProjection) {
		t.Helper()
		h := newLiveHarness(t)
		p := &seenProjection{name: "seen"}
		h.run(h.newRunner(testConfig(poll), nil, p))
		pos := h.appendEvents(1, 1)
		annalstest.WaitFor(t, 5*time.Second, func() bool { return h.isSeen(pos) })
		return h, p
	}
	// listenPIDs returns the backends of the test database whose last
	// statement was a LISTEN.
	listenPIDs := func(h *liveHarness) []int32 {
		h.t.Helper()
		rows, err := h.pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid() ORDER BY pid`)
		if err != nil {
			h.t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			h.t.Fatal(err)
		}
		return pids
	}
	terminate := func(h *liveHarness, pid int32) {
		h.t.Helper()
		var ok bool
		if err := h.pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
			h.t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
		}
	}
	// theListener waits for exactly one LISTEN backend other than old.
	theListener := func(h *liveHarness, old int32) int32 {
		h.t.Helper()
		var pid int32
		annalstest.WaitFor(h.t, 10*time.Second, func() bool {
			pids := listenPIDs(h)
			if len(pids) == 1 && pids[0] != old {
				pid = pids[0]
				return true
			}
			return false
		})
		return pid
	}
	// delivered appends one event and fails unless it is applied in 5 s.
	delivered := func(h *liveHarness, what string) {
		h.t.Helper()
		start := time.Now()
		pos := h.appendEvents(1, 1)
		annalstest.WaitFor(h.t, 5*time.Second, func() bool { return h.isSeen(pos) })
		h.t.Logf("%s: applied after %v", what, time.Since(start))
	}

	t.Run("AppendRightAfterKill", func(t *testing.T) {
		t.Parallel()
		h, p := setup(t)
		old := theListener(h, 0)
		terminate(h, old)
		delivered(h, "appended right after the kill")
		theListener(h, old)
		delivered(h, "appended after the reconnect")
		h.checkSeenIsLog("seen")
		p.checkNoDupes(t)
	})

	// While the listener cannot reconnect (the database refuses new
	// connections), an event is committed and its NOTIFY reaches nobody.
	// Once the listener is back it must wake the runner by itself.
	t.Run("NotifiedWhileNobodyListened", func(t *testing.T) {
		t.Parallel()
		h, p := setup(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := h.pool.Acquire(ctx) // for the append while connecting is refused
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		var db string
		if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
			t.Fatal(err)
		}
		// A database cannot refuse connections to itself: ALTER DATABASE
		// runs from the server's "postgres" database.
		cc := h.pool.Config().ConnConfig.Copy()
		cc.Database = "postgres"
		admin, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = admin.Close(context.Background()) }()
		allow := func(ctx context.Context, on bool) error {
			_, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s ALLOW_CONNECTIONS %t`, pgx.Identifier{db}.Sanitize(), on))
			return err
		}
		old := theListener(h, 0)
		if err := allow(ctx, false); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = allow(context.Background(), true) }() // also when the test fails
		terminate(h, old)
		annalstest.WaitFor(t, 5*time.Second, func() bool {
			var n int
			err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&n)
			return err == nil && n == 0
		})
		var pos int64
		err = conn.QueryRow(ctx, `SELECT global_sequence FROM annals.append_events('acct-0', NULL, '[{"type": "acct.moved", "data": {}}]')`).Scan(&pos)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := allow(ctx, true); err != nil {
			t.Fatal(err)
		}
		annalstest.WaitFor(t, 5*time.Second, func() bool { return h.isSeen(pos) })
		t.Logf("committed while nobody listened: applied %v after connections were allowed again", time.Since(start))
		theListener(h, old)
		delivered(h, "appended after the reconnect")
		h.checkSeenIsLog("seen")
		p.checkNoDupes(t)
	})
}

// TestRegisterRejectsBadInput is the contract's item 8 for Register and
// Run: every mistake gets a clear error and registers nothing.
func TestRegisterRejectsBadInput(t *testing.T) {
	t.Parallel()

	type Opened struct{}
	type Unregistered struct{}
	setup := func(t *testing.T) (*projection.Runner, *eventstore.Registry) {
		t.Helper()
		db := annalstest.NewDB(t, nil)
		r, err := projection.NewRunner(db.Pool, testConfig(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		reg := eventstore.NewRegistry()
		eventstore.MustRegister[Opened](reg, "account.opened")
		return r, reg
	}
	typed := func(name string, reg *eventstore.Registry) *projection.Typed {
		p := projection.New(name, reg)
		projection.On(p, func(context.Context, pgx.Tx, eventstore.Envelope[Opened]) error { return nil })
		return p
	}
	// wantErr fails unless err is an error that matches target (if any)
	// and mentions every string in mention.
	wantErr := func(t *testing.T, err error, target error, mention ...string) {
		t.Helper()
		if err == nil {
			t.Fatal("no error")
		}
		if target != nil && !errors.Is(err, target) {
			t.Errorf("error %q does not match %q", err, target)
		}
		for _, m := range mention {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("error %q does not mention %q", err, m)
			}
		}
	}

	t.Run("Handlers", func(t *testing.T) {
		t.Parallel()
		r, reg := setup(t)
		wantErr(t, r.Register(nil, nil), nil, "nil")
		wantErr(t, r.Register(struct{}{}, nil), nil, "neither")
		wantErr(t, r.Register(&seenProjection{name: ""}, nil), nil, "empty name")
		wantErr(t, r.Register(&deliveryLog{name: ""}, nil), nil, "empty name")
		wantErr(t, r.Register(typed("", reg), nil), nil, "empty name")

		unknown := projection.New("unknown-type", reg)
		projection.On(unknown, func(context.Context, pgx.Tx, eventstore.Envelope[Unregistered]) error { return nil })
		wantErr(t, r.Register(unknown, nil), eventstore.ErrUnknownEventType, "unknown-type", "Unregistered")
		unknownObs := projection.NewObserver("unknown-type-observer", reg)
		projection.Observe(unknownObs, func(context.Context, eventstore.Envelope[Unregistered]) error { return nil })
		wantErr(t, r.Register(unknownObs, nil), eventstore.ErrUnknownEventType, "unknown-type-observer")

		twice := typed("twice", reg)
		projection.On(twice, func(context.Context, pgx.Tx, eventstore.Envelope[Opened]) error { return nil })
		wantErr(t, r.Register(twice, nil), nil, "twice", "account.opened")
		wantErr(t, r.Register(projection.New("no-handlers", reg), nil), nil, "no-handlers")
		noReg := projection.New("no-registry", nil)
		projection.On(noReg, func(context.Context, pgx.Tx, eventstore.Envelope[Opened]) error { return nil })
		wantErr(t, r.Register(noReg, nil), nil, "no-registry", "registry")

		// None of the above registered anything.
		wantErr(t, r.Run(t.Context()), nil, "nothing registered")
		wantErr(t, r.RunUntilCaughtUp(t.Context()), nil, "nothing registered")
	})

	t.Run("TypedNil", func(t *testing.T) {
		t.Parallel()
		r, _ := setup(t)
		for _, h := range []any{(*projection.Typed)(nil), (*projection.TypedObserver)(nil)} {
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Errorf("Register(%T(nil)) panicked: %v", h, p)
					}
				}()
				if err := r.Register(h, nil); err == nil {
					t.Errorf("Register(%T(nil)) = nil", h)
				}
			}()
		}
	})

	t.Run("Options", func(t *testing.T) {
		t.Parallel()
		r, reg := setup(t)
		for _, o := range []projection.Options{
			{Partitions: -1}, {BatchSize: -1}, {CheckpointEvery: -1}, {CheckpointInterval: -time.Second},
		} {
			wantErr(t, r.Register(typed("opts", reg), &o), nil, "opts", "is -1", "must be 0 or more")
		}
		wantErr(t, r.Register(typed("opts", reg), &projection.Options{Partitions: 1025}), nil, "opts", "1025")
		for _, types := range [][]string{{""}, {"ord*"}, {"a..b"}, {"order.*", "*x"}} {
			wantErr(t, r.Register(&seenProjection{name: "globs"}, &projection.Options{Types: types}), catchup.ErrInvalidGlob, "globs")
		}
		wantErr(t, r.Run(t.Context()), nil, "nothing registered")

		// The names are still free: failed registrations changed nothing.
		if err := r.Register(typed("opts", reg), &projection.Options{Partitions: 1024}); err != nil {
			t.Fatal(err)
		}
		if err := r.Register(&seenProjection{name: "globs"}, &projection.Options{Types: []string{"order.*", "*.shipped"}}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Duplicates", func(t *testing.T) {
		t.Parallel()
		r, reg := setup(t)
		if err := r.Register(typed("dup", reg), nil); err != nil {
			t.Fatal(err)
		}
		wantErr(t, r.Register(typed("dup", reg), nil), nil, "dup", "twice")
		wantErr(t, r.Register(&deliveryLog{name: "dup"}, nil), nil, "dup", "twice")
		wantErr(t, r.Register(&seenProjection{name: "dup"}, &projection.Options{Partitions: 4}), nil, "dup", "twice")
		if err := r.Register(&deliveryLog{name: "dup-2"}, nil); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("WhileRunning", func(t *testing.T) {
		t.Parallel()
		db := annalstest.NewDB(t, nil)
		h := liveHarnessOn(t, db.Pool)
		r := h.newRunner(testConfig(time.Second), nil, &seenProjection{name: "seen"})
		h.run(r)
		annalstest.WaitFor(t, 10*time.Second, func() bool { return h.checkpoint("seen") == 0 }) // leading
		wantErr(t, r.Register(&seenProjection{name: "late"}, nil), nil, "after Run")
		wantErr(t, r.Run(t.Context()), nil, "twice")
	})
}
