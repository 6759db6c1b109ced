package projection_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// The helpers of the failure-handling tests (retries, dead letters, parking,
// Stop). They are methods of failHarness or carry the prefix "fail", so that
// they do not collide with the helpers of the other test files.

// failHarness is a migrated database with the read model "seen": one row
// per event a subscriber applied (a projection in its transaction, an
// observer through the pool). The primary key makes a second application
// of an event by a projection fail loudly; applied records the order.
type failHarness struct {
	t     *testing.T
	pool  *pgxpool.Pool
	store *eventstore.Store
	logs  *failLog // the runners' logs
}

// failLog is a log sink that goroutines may share.
type failLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *failLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// logger returns a logger writing one short line per record to l.
func (l *failLog) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if err, ok := a.Value.Any().(error); ok {
				msg := err.Error()
				if len(msg) > 300 {
					msg = msg[:300] + "…"
				}
				return slog.String(a.Key, msg)
			}
			return a
		},
	}))
}

// tail returns the last n lines.
func (l *failLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(l.b.String()), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

const failSeenSchema = `
CREATE TABLE seen (
    subscriber      text      NOT NULL,
    event_id        uuid      NOT NULL,
    global_sequence bigint    NOT NULL,
    stream_id       text      NOT NULL,
    stream_version  bigint    NOT NULL,
    applied         bigserial NOT NULL,
    PRIMARY KEY (subscriber, event_id)
);`

const failInsertSeen = `INSERT INTO seen (subscriber, event_id, global_sequence, stream_id, stream_version)
VALUES ($1, $2, $3, $4, $5)`

func newFailHarness(t *testing.T) *failHarness {
	t.Helper()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(t.Context(), failSeenSchema); err != nil {
		t.Fatal(err)
	}
	return &failHarness{t: t, pool: db.Pool, store: store, logs: &failLog{}}
}

// failEv is an appended event.
type failEv struct {
	ID      uuid.UUID
	Pos     int64
	Stream  string
	Version int64
}

func (e failEv) String() string { return fmt.Sprintf("%s v%d @%d", e.Stream, e.Version, e.Pos) }

// appendTo appends one event to each of streams, in order, one append each.
func (h *failHarness) appendTo(streams ...string) []failEv {
	h.t.Helper()
	evs := make([]failEv, 0, len(streams))
	for i, s := range streams {
		res, err := h.store.Append(context.Background(), s, eventstore.Any,
			eventstore.EventData{Type: "acct.moved", Data: map[string]int{"n": i}})
		if err != nil {
			h.t.Fatal(err)
		}
		a := res.Events[0]
		evs = append(evs, failEv{ID: a.ID, Pos: a.GlobalSequence, Stream: s, Version: a.StreamVersion})
	}
	return evs
}

// failClock is a projection.Clock whose After fires at once for its first
// fire calls (every call when fire < 0) and never after. It records the
// delays it was asked for.
type failClock struct {
	mu     sync.Mutex
	fire   int
	delays []time.Duration
}

func (c *failClock) Now() time.Time { return time.Now() }

func (c *failClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.delays = append(c.delays, d)
	ch := make(chan time.Time, 1)
	if c.fire < 0 || len(c.delays) <= c.fire {
		ch <- time.Now()
	}
	return ch
}

func (c *failClock) requested() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.delays)
}

// failHookCall is one call of a projection.Hooks function.
type failHookCall struct {
	Subscriber string
	Pos        int64
	Attempt    int    // OnRetry
	Reason     string // OnDeadLetter
	Err        string
}

// failHooks records the hook calls.
type failHooks struct {
	mu          sync.Mutex
	retries     []failHookCall
	deadLetters []failHookCall
}

func (r *failHooks) hooks() projection.Hooks {
	return projection.Hooks{
		OnRetry: func(sub string, e eventstore.Event, attempt int, err error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.retries = append(r.retries, failHookCall{Subscriber: sub, Pos: e.GlobalSequence, Attempt: attempt, Err: err.Error()})
		},
		OnDeadLetter: func(sub string, e eventstore.Event, reason string, err error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.deadLetters = append(r.deadLetters, failHookCall{Subscriber: sub, Pos: e.GlobalSequence, Reason: reason, Err: err.Error()})
		},
	}
}

func (r *failHooks) calls() (retries, deadLetters []failHookCall) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.retries), slices.Clone(r.deadLetters)
}

// failFn decides a delivery's outcome; call counts this process's deliveries
// of e, from 1. A nil failFn fails nothing.
type failFn func(ctx context.Context, e eventstore.Event, call int) error

// failHandler is the state of a test projection or observer: it writes each
// event it gets to seen, unless its failFn fails the delivery.
type failHandler struct {
	name string
	pool *pgxpool.Pool

	mu    sync.Mutex
	fail  failFn
	calls map[uuid.UUID]int
	dupes int // observer deliveries of an event already in seen
}

func (h *failHandler) Name() string { return h.name }

// setFail replaces the failFn (nil: the handler is fixed).
func (h *failHandler) setFail(f failFn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fail = f
}

// callsOf returns how often the handler was called with the event.
func (h *failHandler) callsOf(id uuid.UUID) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[id]
}

func (h *failHandler) duplicates() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dupes
}

func (h *failHandler) check(ctx context.Context, e eventstore.Event) error {
	h.mu.Lock()
	h.calls[e.ID]++
	n, f := h.calls[e.ID], h.fail
	h.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(ctx, e, n)
}

// failProjection applies events in the runner's transaction.
type failProjection struct{ *failHandler }

func (p failProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if err := p.check(ctx, e); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, failInsertSeen, p.name, e.ID, e.GlobalSequence, e.StreamID, e.StreamVersion)
	return err
}

// failObserver records events through the pool, outside any transaction of
// the runner, counting repeated deliveries.
type failObserver struct{ *failHandler }

func (o failObserver) Handle(ctx context.Context, e eventstore.Event) error {
	if err := o.check(ctx, e); err != nil {
		return err
	}
	tag, err := o.pool.Exec(ctx, failInsertSeen+` ON CONFLICT DO NOTHING`, o.name, e.ID, e.GlobalSequence, e.StreamID, e.StreamVersion)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		o.mu.Lock()
		o.dupes++
		o.mu.Unlock()
	}
	return nil
}

// failWait bounds each wait for the runner in the background: generous,
// for a loaded machine; a passing test waits a fraction of it.
const failWait = 10 * time.Second

// promptly bounds what must happen "at once" in these tests (a Run
// returning when its context ends while it waits to retry, a catch-up of a
// stopped partition returning ErrStopped): the failures they guard against
// wait for ShutdownTimeout (30 s), a retry timer that never fires or a
// catch-up that never ends, so the bound has room for a loaded -race run
// (2 s was exceeded under make test's parallel packages).
const promptly = 8 * time.Second

// failKind is a kind of subscriber: a transactional projection or an observer.
type failKind struct {
	name       string
	projection bool
}

var failKinds = []failKind{{"Projection", true}, {"Observer", false}}

// handler returns a subscriber of kind k named name.
func (h *failHarness) handler(k failKind, name string, fail failFn) (any, *failHandler) {
	fh := &failHandler{name: name, pool: h.pool, fail: fail, calls: map[uuid.UUID]int{}}
	if k.projection {
		return failProjection{fh}, fh
	}
	return failObserver{fh}, fh
}

// failReg is a handler to register with its options.
type failReg struct {
	handler any
	opts    *projection.Options
}

// failRun is a runner with its clock and hooks.
type failRun struct {
	r     *projection.Runner
	clock *failClock
	hooks *failHooks
}

// newRunner returns a runner with retry as its Config.Retry, a failClock
// firing fire times (-1: always) and recorded hooks.
func (h *failHarness) newRunner(retry projection.RetryPolicy, fire int, regs ...failReg) *failRun {
	h.t.Helper()
	run := &failRun{clock: &failClock{fire: fire}, hooks: &failHooks{}}
	r, err := projection.NewRunner(h.pool, &projection.Config{
		PollInterval:      200 * time.Millisecond,
		LockRetryInterval: 100 * time.Millisecond,
		RetryBackoff:      50 * time.Millisecond,
		ShutdownTimeout:   5 * time.Second,
		Retry:             &retry,
		Clock:             run.clock,
		Hooks:             run.hooks.hooks(),
		Logger:            h.logs.logger(),
	})
	if err != nil {
		h.t.Fatal(err)
	}
	for _, reg := range regs {
		if err := r.Register(reg.handler, reg.opts); err != nil {
			h.t.Fatal(err)
		}
	}
	run.r = r
	return run
}

// catchUp runs RunUntilCaughtUp with a deadline, so that a hang fails the
// test rather than hanging it.
func (run *failRun) catchUp() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return run.r.RunUntilCaughtUp(ctx)
}

// start runs the runner in the background. stop cancels its context and
// returns how long Run took to return; it fails the test unless Run returns
// nil within 10 s. The test's end stops it too.
func (h *failHarness) start(run *failRun) (stop func() time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run.r.Run(ctx) }()
	var once sync.Once
	var took time.Duration
	stop = func() time.Duration {
		once.Do(func() {
			begin := time.Now()
			cancel()
			select {
			case err := <-done:
				took = time.Since(begin)
				if err != nil {
					h.t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				took = time.Since(begin)
				h.t.Errorf("Run did not return 10 s after its context ended")
			}
		})
		return took
	}
	h.t.Cleanup(func() { stop() }) // before the pool closes: cleanups run last-in first-out
	return stop
}

// waitFor waits for cond like annalstest.WaitFor and logs the tables if it
// fails.
func (h *failHarness) waitFor(timeout time.Duration, what string, cond func() bool) {
	h.t.Helper()
	ok := false
	defer func() {
		if !ok {
			h.t.Logf("while waiting for %s:\n%s", what, h.dump())
		}
	}()
	annalstest.WaitFor(h.t, timeout, cond)
	ok = true
}

func (h *failHarness) queryInt(sql string, args ...any) int64 {
	h.t.Helper()
	var n int64
	if err := h.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		h.t.Fatal(err)
	}
	return n
}

// attempts returns the attempt numbers of the failures rows of sub's event
// id, in the order they were written.
func (h *failHarness) attempts(sub string, id uuid.UUID) []int {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(),
		`SELECT attempt FROM annals.failures WHERE subscriber_id = $1 AND event_id = $2 ORDER BY id`, sub, id)
	if err != nil {
		h.t.Fatal(err)
	}
	a, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		h.t.Fatal(err)
	}
	return a
}

// failureErrors returns the error column of sub's failures rows, in order.
func (h *failHarness) failureErrors(sub string) []string {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(),
		`SELECT error FROM annals.failures WHERE subscriber_id = $1 ORDER BY id`, sub)
	if err != nil {
		h.t.Fatal(err)
	}
	e, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		h.t.Fatal(err)
	}
	return e
}

// failDeadLetter is a row of dead_letters.
type failDeadLetter struct {
	ID       int64
	Pos      int64
	EventID  uuid.UUID
	Stream   string
	Reason   string
	Status   string
	Error    string
	Detail   string
	Attempts int
	First    *time.Time
	Last     *time.Time
}

func (d failDeadLetter) String() string {
	return fmt.Sprintf("#%d %s @%d %s %s attempts=%d", d.ID, d.Stream, d.Pos, d.Reason, d.Status, d.Attempts)
}

// deadLetters returns sub's dead letters in position order.
func (h *failHarness) deadLetters(sub string) []failDeadLetter {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(), `
		SELECT id, global_sequence, event_id, stream_id, reason, status, error, error_detail, attempts,
		       first_failed_at, last_failed_at
		  FROM annals.dead_letters WHERE subscriber_id = $1 ORDER BY global_sequence`, sub)
	if err != nil {
		h.t.Fatal(err)
	}
	var d failDeadLetter
	var out []failDeadLetter
	_, err = pgx.ForEachRow(rows, []any{&d.ID, &d.Pos, &d.EventID, &d.Stream, &d.Reason, &d.Status, &d.Error, &d.Detail, &d.Attempts, &d.First, &d.Last},
		func() error { out = append(out, d); return nil })
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// seen returns the events sub applied, in the order it applied them.
func (h *failHarness) seen(sub string) []failEv {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(),
		`SELECT event_id, global_sequence, stream_id, stream_version FROM seen WHERE subscriber = $1 ORDER BY applied`, sub)
	if err != nil {
		h.t.Fatal(err)
	}
	var e failEv
	var out []failEv
	_, err = pgx.ForEachRow(rows, []any{&e.ID, &e.Pos, &e.Stream, &e.Version}, func() error { out = append(out, e); return nil })
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// checkpoint returns sub's checkpoint position (-1 when it has none) and
// stop reason.
func (h *failHarness) checkpoint(sub string) (int64, *string) {
	h.t.Helper()
	var pos int64
	var stopped *string
	err := h.pool.QueryRow(context.Background(),
		`SELECT position, stopped_reason FROM annals.checkpoints WHERE subscriber_id = $1 AND partition = 0`, sub).Scan(&pos, &stopped)
	if errors.Is(err, pgx.ErrNoRows) {
		return -1, nil
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return pos, stopped
}

// release does what an operator's "dlq retry" does: it marks the open dead
// letters of the stream for re-delivery and clears the partition's Stop, in
// one transaction.
func (h *failHarness) release(sub, stream string) {
	h.t.Helper()
	err := pgx.BeginFunc(context.Background(), h.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), `UPDATE annals.dead_letters SET status = 'retry', updated_at = clock_timestamp()
			WHERE subscriber_id = $1 AND partition = 0 AND stream_id = $2 AND status = 'open'`, sub, stream); err != nil {
			return err
		}
		_, err := tx.Exec(context.Background(), `UPDATE annals.checkpoints SET stopped_reason = NULL, stopped_at = NULL
			WHERE subscriber_id = $1 AND partition = 0`, sub)
		return err
	})
	if err != nil {
		h.t.Fatal(err)
	}
}

// dump describes the tables, for failure messages.
func (h *failHarness) dump() string {
	var b strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, q := range []string{
		`SELECT subscriber_id, partition, position, epoch, coalesce(stopped_reason, '-') FROM annals.checkpoints ORDER BY 1, 2`,
		`SELECT subscriber_id, global_sequence, stream_id, reason, status, attempts, left(error, 120) FROM annals.dead_letters ORDER BY 1, 2`,
		`SELECT subscriber_id, global_sequence, attempt, left(error, 120) FROM annals.failures ORDER BY id`,
		`SELECT subscriber, global_sequence, stream_id, stream_version FROM seen ORDER BY applied`,
	} {
		fmt.Fprintf(&b, "%s\n", q)
		rows, err := h.pool.Query(ctx, q)
		if err != nil {
			fmt.Fprintf(&b, "  error: %v\n", err)
			continue
		}
		for rows.Next() {
			v, err := rows.Values()
			if err != nil {
				fmt.Fprintf(&b, "  error: %v\n", err)
				break
			}
			fmt.Fprintf(&b, "  %v\n", v)
		}
		rows.Close()
	}
	fmt.Fprintf(&b, "runner log (tail):\n%s\n", h.logs.tail(8))
	return b.String()
}

// checkApplied checks that sub applied exactly the events want, each once,
// and every stream's events in stream order.
func (h *failHarness) checkApplied(sub string, want []failEv) {
	h.t.Helper()
	got := h.seen(sub)
	count := map[uuid.UUID]int{}
	for _, e := range got {
		count[e.ID]++
	}
	wanted := map[uuid.UUID]bool{}
	for _, e := range want {
		wanted[e.ID] = true
		if count[e.ID] != 1 {
			h.t.Errorf("%s: %v applied %d times, want once", sub, e, count[e.ID])
		}
	}
	last := map[string]int64{}
	for _, e := range got {
		if !wanted[e.ID] {
			h.t.Errorf("%s: %v applied, want not", sub, e)
		}
		if e.Version <= last[e.Stream] {
			h.t.Errorf("%s: %v applied after version %d of its stream", sub, e, last[e.Stream])
		}
		last[e.Stream] = e.Version
	}
	if h.t.Failed() {
		h.t.Logf("%s applied (in order): %v", sub, got)
	}
}

// checkFailed checks a dead letter of a spent event.
func (h *failHarness) checkFailed(d failDeadLetter, ev failEv, attempts int) {
	h.t.Helper()
	h.checkFailedAt(d, ev, attempts, "failures_test.go:")
}

// checkFailedAt is checkFailed with the file the stack trace must show.
func (h *failHarness) checkFailedAt(d failDeadLetter, ev failEv, attempts int, stackFile string) {
	h.t.Helper()
	if d.EventID != ev.ID || d.Pos != ev.Pos || d.Stream != ev.Stream {
		h.t.Errorf("dead letter %v is not for %v", d, ev)
	}
	if d.Reason != "failed" || d.Status != "open" || d.Attempts != attempts {
		h.t.Errorf("dead letter %v: want reason failed, status open, %d attempts", d, attempts)
	}
	if d.First == nil || d.Last == nil || d.Last.Before(*d.First) {
		h.t.Errorf("dead letter %v: first_failed_at %v, last_failed_at %v", d, d.First, d.Last)
	}
	// The stack trace of the handler's error reaches the table.
	if !strings.Contains(d.Detail, stackFile) {
		h.t.Errorf("dead letter %v: error_detail has no stack trace through the handler:\n%s", d, d.Detail)
	}
}

// failOn returns a failFn failing, with a stack, each delivery of the event
// at version of stream.
func failOn(stream string, version int64) failFn {
	return func(_ context.Context, e eventstore.Event, call int) error {
		if e.StreamID == stream && e.StreamVersion == version {
			return errors.Newf("cannot handle %s v%d (call %d)", e.StreamID, e.StreamVersion, call)
		}
		return nil
	}
}

// A transient error is retried after the policy's delays until the handler
// succeeds: the event is applied once, every attempt that failed is a
// failures row, nothing is dead-lettered.
func TestFailureTransientRetry(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub = "transient"
			evs := h.appendTo("acct-1", "acct-2", "acct-1", "acct-2", "acct-1")
			bad := evs[2]
			handler, fh := h.handler(k, sub, func(_ context.Context, e eventstore.Event, call int) error {
				if e.ID == bad.ID && call < 3 {
					return errors.Newf("transient failure %d", call)
				}
				return nil
			})
			run := h.newRunner(projection.RetryPolicy{MaxRetries: 3, InitialDelay: time.Second, Multiplier: 2, Jitter: -1}, -1,
				failReg{handler, nil})
			if err := run.catchUp(); err != nil {
				t.Fatal(err)
			}
			h.checkApplied(sub, evs)
			if got := h.seen(sub); len(got) != len(evs) {
				t.Errorf("applied %v, want %v", got, evs)
			}
			if n := fh.callsOf(bad.ID); n != 3 {
				t.Errorf("handler called %d times with the failing event, want 3", n)
			}
			// The two failed attempts were rows (the OnRetry calls below
			// count 1 and 2 from them); they go when the event succeeds.
			if n := h.queryInt(`SELECT count(*) FROM annals.failures`); n != 0 {
				t.Errorf("%d failures rows, want none left (deleted when the event succeeded)", n)
			}
			if dls := h.deadLetters(sub); len(dls) != 0 {
				t.Errorf("dead letters %v, want none", dls)
			}
			retries, dead := run.hooks.calls()
			if len(retries) != 2 || retries[0].Attempt != 1 || retries[1].Attempt != 2 ||
				retries[0].Pos != bad.Pos || retries[0].Subscriber != sub || !strings.Contains(retries[1].Err, "transient failure 2") {
				t.Errorf("OnRetry calls %+v, want attempts 1 and 2 of %v", retries, bad)
			}
			if len(dead) != 0 {
				t.Errorf("OnDeadLetter calls %+v, want none", dead)
			}
			if got, want := run.clock.requested(), []time.Duration{time.Second, 2 * time.Second}; !slices.Equal(got, want) {
				t.Errorf("retry delays %v, want %v", got, want)
			}
			if pos, _ := h.checkpoint(sub); pos != evs[len(evs)-1].Pos {
				t.Errorf("checkpoint %d, want %d", pos, evs[len(evs)-1].Pos)
			}
			if n := fh.duplicates(); n != 0 {
				t.Errorf("%d repeated deliveries", n)
			}
		})
	}
}

// SkipEvent: when the retries are spent the event is dead-lettered and the
// subscriber moves on, with later events of the same stream too, also in
// later batches.
func TestFailureSkipEvent(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub = "skipper"
			evs := h.appendTo("bad", "bad", "good", "bad", "good")
			bad := evs[1]
			handler, fh := h.handler(k, sub, failOn("bad", 2))
			opts := &projection.Options{OnDeadLetter: projection.SkipEvent}
			if !k.projection {
				opts = nil // SkipEvent is the observers' default
			}
			// 5 attempts: delays 1s, 2s, 4s, then capped at 5s.
			run := h.newRunner(projection.RetryPolicy{MaxRetries: 4, InitialDelay: time.Second, Multiplier: 2, MaxDelay: 5 * time.Second, Jitter: -1}, -1,
				failReg{handler, opts})
			if err := run.catchUp(); err != nil {
				t.Fatal(err)
			}
			dls := h.deadLetters(sub)
			if len(dls) != 1 {
				t.Fatalf("dead letters %v, want one", dls)
			}
			h.checkFailed(dls[0], bad, 5)
			if got := h.attempts(sub, bad.ID); !slices.Equal(got, []int{1, 2, 3, 4, 5}) {
				t.Errorf("failures attempts %v, want 1 to 5", got)
			}
			if n := fh.callsOf(bad.ID); n != 5 {
				t.Errorf("handler called %d times with the failing event, want 5", n)
			}
			want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second}
			if got := run.clock.requested(); !slices.Equal(got, want) {
				t.Errorf("retry delays %v, want %v", got, want)
			}
			retries, dead := run.hooks.calls()
			if len(retries) != 4 {
				t.Errorf("OnRetry calls %+v, want 4", retries)
			}
			if len(dead) != 1 || dead[0].Reason != "failed" || dead[0].Pos != bad.Pos || dead[0].Subscriber != sub {
				t.Errorf("OnDeadLetter calls %+v, want one, failed, for %v", dead, bad)
			}
			h.checkApplied(sub, slices.Delete(slices.Clone(evs), 1, 2))

			// A later batch: the stream is not parked, its events flow on.
			more := h.appendTo("bad", "good", "bad")
			if err := run.catchUp(); err != nil {
				t.Fatal(err)
			}
			if dls := h.deadLetters(sub); len(dls) != 1 {
				t.Errorf("dead letters after the later batch %v, want only the first", dls)
			}
			h.checkApplied(sub, append(slices.Delete(slices.Clone(evs), 1, 2), more...))
			if pos, stopped := h.checkpoint(sub); pos != more[len(more)-1].Pos || stopped != nil {
				t.Errorf("checkpoint %d (stopped %v), want %d", pos, stopped, more[len(more)-1].Pos)
			}
		})
	}
}

// ParkStream: the later events of a dead-lettered event's stream are parked
// in order while other streams flow; a release re-delivers them in stream
// order, a failed re-delivery parks the stream again.
func TestFailureParkStream(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub = "parker"
			handler, fh := h.handler(k, sub, failOn("bad", 2))
			opts := &projection.Options{OnDeadLetter: projection.ParkStream}
			if k.projection {
				opts = nil // ParkStream is the projections' default
			}
			run := h.newRunner(projection.RetryPolicy{MaxRetries: 1, Jitter: -1}, -1, failReg{handler, opts})
			all := h.appendTo("bad", "bad", "good", "bad", "good", "bad")
			h.start(run)

			// bad v2 fails twice and is dead-lettered; v3 and v4 are parked
			// behind it, in order; good flows. (OnDeadLetter of a parked
			// event runs after the transaction that parked it commits:
			// wait for its calls too.)
			h.waitFor(failWait, "the stream to be parked", func() bool {
				_, dead := run.hooks.calls()
				return len(h.deadLetters(sub)) == 3 && len(h.seen(sub)) == 3 && len(dead) >= 3
			})
			dls := h.deadLetters(sub)
			h.checkFailed(dls[0], all[1], 2)
			for i, ev := range []failEv{all[3], all[5]} {
				d := dls[i+1]
				if d.EventID != ev.ID || d.Reason != "parked" || d.Status != "open" || d.Attempts != 0 {
					t.Errorf("dead letter %v, want %v parked and open", d, ev)
				}
			}
			if dls[0].ID > dls[1].ID || dls[1].ID > dls[2].ID {
				t.Errorf("dead letters %v not written in stream order", dls)
			}
			h.checkApplied(sub, []failEv{all[0], all[2], all[4]})
			_, dead := run.hooks.calls()
			if len(dead) != 3 || dead[0].Reason != "failed" || dead[1].Reason != "parked" || dead[2].Reason != "parked" ||
				dead[1].Pos != all[3].Pos || dead[2].Pos != all[5].Pos {
				t.Errorf("OnDeadLetter calls %+v, want failed %v, parked %v, parked %v", dead, all[1], all[3], all[5])
			}

			// While parked: other streams flow, the stream's new events park.
			more := h.appendTo("good", "bad")
			all = append(all, more...)
			h.waitFor(failWait, "another stream to flow", func() bool {
				return len(h.seen(sub)) == 4 && len(h.deadLetters(sub)) == 4
			})
			if d := h.deadLetters(sub)[3]; d.EventID != more[1].ID || d.Reason != "parked" || d.Status != "open" {
				t.Errorf("dead letter %v, want %v parked and open", d, more[1])
			}

			// A release while the handler still fails: the re-delivery fails,
			// the entries are open again, the stream stays parked.
			h.release(sub, "bad")
			h.waitFor(failWait, "the failed re-delivery", func() bool {
				dls := h.deadLetters(sub)
				return dls[0].Attempts == 3 && !slices.ContainsFunc(dls, func(d failDeadLetter) bool { return d.Status != "open" })
			})
			if got := h.attempts(sub, all[1].ID); !slices.Equal(got, []int{1, 2, 3}) {
				t.Errorf("failures attempts %v, want [1 2 3]", got)
			}
			for _, ev := range []failEv{all[3], all[5], more[1]} {
				if n := fh.callsOf(ev.ID); n != 0 {
					t.Errorf("parked %v was handed to the handler %d times before the event it waits for succeeded", ev, n)
				}
			}
			more = h.appendTo("good", "bad")
			all = append(all, more...)
			h.waitFor(failWait, "another stream to flow again", func() bool {
				return len(h.seen(sub)) == 5 && len(h.deadLetters(sub)) == 5
			})
			if d := h.deadLetters(sub)[4]; d.EventID != more[1].ID || d.Reason != "parked" || d.Status != "open" {
				t.Errorf("dead letter %v, want %v parked and open", d, more[1])
			}
			h.checkApplied(sub, []failEv{all[0], all[2], all[4], all[6], all[8]})

			// Fixed and released: the failed and parked events are applied in
			// stream order and resolved; new events of the stream flow.
			fh.setFail(nil)
			h.release(sub, "bad")
			more = h.appendTo("bad")
			all = append(all, more...)
			h.waitFor(failWait, "the re-delivery", func() bool { return len(h.seen(sub)) == len(all) })
			for _, d := range h.deadLetters(sub) {
				if d.Status != "resolved" {
					t.Errorf("dead letter %v, want resolved", d)
				}
			}
			more = h.appendTo("bad", "good", "bad")
			all = append(all, more...)
			h.waitFor(failWait, "new events", func() bool { return len(h.seen(sub)) == len(all) })
			h.checkApplied(sub, all)
			if dls := h.deadLetters(sub); len(dls) != 5 {
				t.Errorf("dead letters %v, want the 5 resolved ones only", dls)
			}
			// An observer writes its checkpoint within CheckpointInterval (1 s).
			h.waitFor(failWait, "the checkpoint", func() bool {
				pos, _ := h.checkpoint(sub)
				return pos == all[len(all)-1].Pos
			})
			if n := fh.duplicates(); n != 0 {
				t.Errorf("%d repeated deliveries", n)
			}
		})
	}
}

// Stop: the subscriber partition halts right after the dead-lettered event
// while another subscriber of the same runner keeps running; a release
// (which clears the stop) resumes it.
func TestFailureStop(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub, other = "stopper", "other"
			handler, fh := h.handler(k, sub, failOn("bad", 2))
			otherHandler, _ := h.handler(failKinds[0], other, nil)
			run := h.newRunner(projection.RetryPolicy{MaxRetries: 1, Jitter: -1}, -1,
				failReg{handler, &projection.Options{OnDeadLetter: projection.Stop}}, failReg{otherHandler, nil})
			all := h.appendTo("bad", "bad", "good", "bad")
			h.start(run)

			h.waitFor(failWait, "the stop", func() bool {
				_, stopped := h.checkpoint(sub)
				return stopped != nil && len(h.seen(other)) == len(all)
			})
			pos, stopped := h.checkpoint(sub)
			if pos != all[1].Pos || !strings.Contains(*stopped, all[1].ID.String()) {
				t.Errorf("checkpoint %d, stopped %q; want %d and a reason naming %v", pos, *stopped, all[1].Pos, all[1])
			}
			dls := h.deadLetters(sub)
			if len(dls) != 1 {
				t.Fatalf("dead letters %v, want one", dls)
			}
			h.checkFailed(dls[0], all[1], 2)
			h.checkApplied(sub, all[:1])

			// Stopped: nothing later is applied, while the other subscriber
			// keeps applying.
			all = append(all, h.appendTo("good", "bad")...)
			h.waitFor(failWait, "the other subscriber", func() bool { return len(h.seen(other)) == len(all) })
			h.checkApplied(sub, all[:1])
			for _, ev := range all[2:] {
				if n := fh.callsOf(ev.ID); n != 0 {
					t.Errorf("stopped subscriber got %v %d times", ev, n)
				}
			}
			if p, s := h.checkpoint(sub); p != pos || s == nil {
				t.Errorf("checkpoint %d, stopped %v while stopped; want %d, stopped", p, s, pos)
			}
			if dls := h.deadLetters(sub); len(dls) != 1 {
				t.Errorf("dead letters %v while stopped, want one", dls)
			}

			// Fixed, released and resumed.
			fh.setFail(nil)
			h.release(sub, "bad")
			h.waitFor(failWait, "the resumption", func() bool { return len(h.seen(sub)) == len(all) })
			h.checkApplied(sub, all)
			h.checkApplied(other, all)
			if d := h.deadLetters(sub); len(d) != 1 || d[0].Status != "resolved" {
				t.Errorf("dead letters %v, want one, resolved", d)
			}
			h.waitFor(failWait, "the checkpoint", func() bool {
				p, s := h.checkpoint(sub)
				return p == all[len(all)-1].Pos && s == nil
			})
			if n := fh.duplicates(); n != 0 {
				t.Errorf("%d repeated deliveries", n)
			}
		})
	}
}

// spentAtOnce runs a subscriber whose handler does what fail says for the
// event of stream "bad", and returns the harness, the runner, the events
// (bad is the second) and the dead letter.
func spentAtOnce(t *testing.T, k failKind, retry projection.RetryPolicy, opts *projection.Options, fail failFn) (*failHarness, *failRun, []failEv, failDeadLetter) {
	t.Helper()
	h := newFailHarness(t)
	evs := h.appendTo("ok-1", "bad", "ok-2")
	handler, _ := h.handler(k, "spent", fail)
	run := h.newRunner(retry, -1, failReg{handler, opts})
	if err := run.catchUp(); err != nil {
		t.Fatal(err)
	}
	h.checkApplied("spent", []failEv{evs[0], evs[2]})
	dls := h.deadLetters("spent")
	if len(dls) != 1 {
		t.Fatalf("dead letters %v, want one", dls)
	}
	return h, run, evs, dls[0]
}

// annals.Permanent errors are dead-lettered after one attempt.
func TestFailurePermanent(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h, run, evs, d := spentAtOnce(t, k, projection.RetryPolicy{MaxRetries: 3}, nil,
				func(_ context.Context, e eventstore.Event, _ int) error {
					if e.StreamID == "bad" {
						return annals.Permanent(errors.New("malformed payload"))
					}
					return nil
				})
			h.checkFailed(d, evs[1], 1)
			if !strings.Contains(d.Error, "malformed payload") {
				t.Errorf("error %q", d.Error)
			}
			if got := h.attempts("spent", evs[1].ID); !slices.Equal(got, []int{1}) {
				t.Errorf("failures attempts %v, want [1]", got)
			}
			if got := run.clock.requested(); len(got) != 0 {
				t.Errorf("waited %v before dead-lettering a permanent failure", got)
			}
			if retries, dead := run.hooks.calls(); len(retries) != 0 || len(dead) != 1 {
				t.Errorf("hooks: OnRetry %+v, OnDeadLetter %+v; want none and one", retries, dead)
			}
		})
	}
}

// A panic is a failed attempt whose dead letter holds the panic value and
// the stack.
func TestFailurePanic(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h, _, evs, d := spentAtOnce(t, k, projection.RetryPolicy{MaxRetries: 1, Jitter: -1}, nil,
				func(_ context.Context, e eventstore.Event, _ int) error {
					if e.StreamID == "bad" {
						panic(fmt.Sprintf("boom in %s v%d", e.StreamID, e.StreamVersion))
					}
					return nil
				})
			h.checkFailed(d, evs[1], 2)
			if !strings.Contains(d.Error, "handler panicked: boom in bad v1") {
				t.Errorf("error %q, want the panic value", d.Error)
			}
			for _, s := range []string{"boom in bad v1", "panic(", "runtime/debug.Stack"} {
				if !strings.Contains(d.Detail, s) {
					t.Errorf("error_detail lacks %q:\n%s", s, d.Detail)
				}
			}
			if got := h.attempts("spent", evs[1].ID); !slices.Equal(got, []int{1, 2}) {
				t.Errorf("failures attempts %v, want [1 2]", got)
			}
		})
	}
}

// A handler that outlives HandlerTimeout (it waits for its context) fails
// the attempt; the event is dead-lettered when the retries are spent.
func TestFailureHandlerTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			begin := time.Now()
			h, _, evs, d := spentAtOnce(t, k, projection.RetryPolicy{MaxRetries: 1, Jitter: -1}, &projection.Options{HandlerTimeout: timeout},
				func(ctx context.Context, e eventstore.Event, _ int) error {
					if e.StreamID == "bad" {
						<-ctx.Done()
						return errors.Wrap(ctx.Err(), "waited for the context")
					}
					return nil
				})
			if took := time.Since(begin); took < 2*timeout {
				t.Errorf("two attempts took %v, want at least 2 × %v", took, timeout)
			}
			h.checkFailed(d, evs[1], 2)
			if got := h.attempts("spent", evs[1].ID); !slices.Equal(got, []int{1, 2}) {
				t.Errorf("failures attempts %v, want [1 2]", got)
			}
			for _, e := range h.failureErrors("spent") {
				if !strings.Contains(e, "timed out after 200ms") || !strings.Contains(e, "deadline exceeded") {
					t.Errorf("failure %q, want a timeout", e)
				}
			}
		})
	}
}

// A projection's handler whose statement outlives HandlerTimeout: the
// attempt fails like any other, and the event is dead-lettered when the
// retries are spent.
func TestFailureHandlerTimeoutInStatement(t *testing.T) {
	t.Parallel()
	h := newFailHarness(t)
	evs := h.appendTo("ok-1", "bad", "ok-2")
	fh := &failHandler{name: "sleeper", pool: h.pool, calls: map[uuid.UUID]int{}}
	run := h.newRunner(projection.RetryPolicy{MaxRetries: 1, Jitter: -1}, -1,
		failReg{failSleeper{fh}, &projection.Options{HandlerTimeout: 200 * time.Millisecond}})
	h.start(run)
	h.waitFor(5*time.Second, "the dead letter", func() bool { return len(h.deadLetters("sleeper")) == 1 })
	// The handler returns pgx's error, which has no stack of its own: the
	// trace starts where the runner wraps it.
	h.checkFailedAt(h.deadLetters("sleeper")[0], evs[1], 2, "projection/process.go:")
	h.waitFor(failWait, "the later event", func() bool { return len(h.seen("sleeper")) == 2 })
	h.checkApplied("sleeper", []failEv{evs[0], evs[2]})
}

// failSleeper is a projection whose handler sleeps in a statement for the
// events of stream "bad".
type failSleeper struct{ *failHandler }

func (p failSleeper) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if e.StreamID == "bad" {
		_, err := tx.Exec(ctx, `SELECT pg_sleep(10)`)
		return err
	}
	_, err := tx.Exec(ctx, failInsertSeen, p.name, e.ID, e.GlobalSequence, e.StreamID, e.StreamVersion)
	return err
}

// The attempt count is stored: a runner that stops while it waits to retry
// (and stops at once) hands the count to the next one, which goes on from it.
func TestFailureAttemptsSurviveRestart(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub = "restarted"
			evs := h.appendTo("ok", "bad", "ok")
			bad := evs[1]
			handler, fh := h.handler(k, sub, failOn("bad", 1))
			policy := projection.RetryPolicy{MaxRetries: 3, InitialDelay: time.Second, Multiplier: 2, Jitter: -1}

			// The first runner's clock lets one retry through, then never
			// fires: it fails twice and waits.
			first := h.newRunner(policy, 1, failReg{handler, nil})
			stop := h.start(first)
			h.waitFor(failWait, "two attempts", func() bool {
				return len(h.attempts(sub, bad.ID)) == 2 && len(first.clock.requested()) == 2
			})
			took := stop()
			t.Logf("Run returned %v after its context ended, while waiting to retry", took)
			if took > promptly {
				t.Errorf("Run took %v to return while waiting to retry", took)
			}
			if got := h.attempts(sub, bad.ID); !slices.Equal(got, []int{1, 2}) {
				t.Errorf("failures attempts %v after the first runner, want [1 2]", got)
			}
			if dls := h.deadLetters(sub); len(dls) != 0 {
				t.Fatalf("dead letters %v after the first runner, want none", dls)
			}
			if got, want := first.clock.requested(), []time.Duration{time.Second, 2 * time.Second}; !slices.Equal(got, want) {
				t.Errorf("first runner's delays %v, want %v", got, want)
			}

			// The second runner goes on with attempt 3 and dead-letters after
			// attempt 4 (MaxRetries 3).
			second := h.newRunner(policy, -1, failReg{handler, nil})
			h.start(second)
			h.waitFor(failWait, "the dead letter", func() bool { return len(h.deadLetters(sub)) == 1 })
			h.checkFailed(h.deadLetters(sub)[0], bad, 4)
			if got := h.attempts(sub, bad.ID); !slices.Equal(got, []int{1, 2, 3, 4}) {
				t.Errorf("failures attempts %v, want [1 2 3 4]", got)
			}
			if n := fh.callsOf(bad.ID); n != 4 {
				t.Errorf("%d calls with the failing event, want 4", n)
			}
			retries, dead := second.hooks.calls()
			if len(retries) != 1 || retries[0].Attempt != 3 || len(dead) != 1 {
				t.Errorf("second runner's hooks: OnRetry %+v, OnDeadLetter %+v; want attempt 3, one dead letter", retries, dead)
			}
			if got, want := second.clock.requested(), []time.Duration{4 * time.Second}; !slices.Equal(got, want) {
				t.Errorf("second runner's delays %v, want %v", got, want)
			}
			h.waitFor(failWait, "the later event", func() bool { return len(h.seen(sub)) == 2 })
			h.checkApplied(sub, []failEv{evs[0], evs[2]})
			if n := fh.duplicates(); n != 0 {
				t.Errorf("%d repeated deliveries", n)
			}
		})
	}
}

// A failing event in the middle of a batch: its batch-mates are applied
// once each, in order.
func TestFailureMidBatch(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub = "batched"
			streams := make([]string, 50)
			for i := range streams {
				streams[i] = fmt.Sprintf("acct-%d", i%5)
			}
			evs := h.appendTo(streams...)
			bad := evs[24]
			handler, fh := h.handler(k, sub, func(_ context.Context, e eventstore.Event, call int) error {
				if e.ID == bad.ID && call == 1 {
					return errors.New("once")
				}
				return nil
			})
			run := h.newRunner(projection.RetryPolicy{Jitter: -1}, -1, failReg{handler, &projection.Options{BatchSize: 50}})
			if err := run.catchUp(); err != nil {
				t.Fatal(err)
			}
			got := h.seen(sub)
			if len(got) != len(evs) {
				t.Errorf("%d events applied, want %d", len(got), len(evs))
			}
			for i := range min(len(got), len(evs)) {
				if got[i].ID != evs[i].ID {
					t.Fatalf("applied #%d is %v, want %v (applied: %v)", i, got[i], evs[i], got)
				}
			}
			if n := h.queryInt(`SELECT count(*) FROM seen WHERE subscriber = $1`, sub); n != int64(len(evs)) {
				t.Errorf("seen holds %d rows, want %d", n, len(evs))
			}
			if retries, _ := run.hooks.calls(); len(retries) != 1 || retries[0].Attempt != 1 || retries[0].Pos != bad.Pos {
				t.Errorf("retries %+v; want one, attempt 1 of %v", retries, bad)
			}
			if n := h.queryInt(`SELECT count(*) FROM annals.failures`); n != 0 {
				t.Errorf("%d failures rows; want none left (deleted when the event succeeded)", n)
			}
			if dls := h.deadLetters(sub); len(dls) != 0 {
				t.Errorf("dead letters %v, want none", dls)
			}
			if n := fh.duplicates(); n != 0 {
				t.Errorf("%d repeated deliveries", n)
			}
		})
	}
}

// RunUntilCaughtUp on a stopped subscriber partition returns ErrStopped at
// once: with events after the dead-lettered one, and when the dead-lettered
// event is the last of the log.
func TestFailureRunUntilCaughtUpStopped(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		for _, c := range []struct {
			name    string
			streams []string
		}{
			{"EventsAfter", []string{"bad", "good"}},
			{"AtHead", []string{"good", "bad"}},
		} {
			t.Run(k.name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				h := newFailHarness(t)
				const sub = "halted"
				evs := h.appendTo(c.streams...)
				handler, _ := h.handler(k, sub, failOn("bad", 1))
				run := h.newRunner(projection.RetryPolicy{MaxRetries: -1}, -1, failReg{handler, &projection.Options{OnDeadLetter: projection.Stop}})
				err := run.catchUp()
				if !errors.Is(err, catchup.ErrStopped) {
					t.Errorf("the run that stopped the subscriber: %v, want ErrStopped", err)
				}
				if _, stopped := h.checkpoint(sub); stopped == nil {
					t.Fatal("the subscriber is not stopped")
				}
				for i := range 2 {
					begin := time.Now()
					err := run.catchUp()
					if took := time.Since(begin); !errors.Is(err, catchup.ErrStopped) || took > promptly {
						t.Errorf("run %d on the stopped subscriber: %v after %v, want ErrStopped at once", i+2, err, took)
					}
				}
				// Applied: the events before the dead-lettered one.
				h.checkApplied(sub, evs[:slices.IndexFunc(evs, func(e failEv) bool { return e.Stream == "bad" })])
			})
		}
	}
}

// Stop, when the operator's retry fails again: the dead letter is open
// again and the partition halts again, as it did the first time; nothing
// after the dead-lettered event is applied.
func TestFailureStopRedeliveryFails(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub, other = "stopper", "other"
			handler, _ := h.handler(k, sub, failOn("bad", 2))
			otherHandler, _ := h.handler(failKinds[0], other, nil)
			run := h.newRunner(projection.RetryPolicy{MaxRetries: 1, Jitter: -1}, -1,
				failReg{handler, &projection.Options{OnDeadLetter: projection.Stop}}, failReg{otherHandler, nil})
			all := h.appendTo("bad", "bad", "good")
			h.start(run)
			h.waitFor(failWait, "the stop", func() bool {
				_, stopped := h.checkpoint(sub)
				return stopped != nil && len(h.seen(other)) == len(all)
			})
			pos, _ := h.checkpoint(sub)

			h.release(sub, "bad") // the handler still fails
			h.waitFor(failWait, "the failed re-delivery", func() bool {
				dls := h.deadLetters(sub)
				return len(dls) == 1 && dls[0].Attempts == 3 && dls[0].Status == "open"
			})
			all = append(all, h.appendTo("good", "bad")...)
			h.waitFor(failWait, "the other subscriber", func() bool { return len(h.seen(other)) == len(all) })
			if p, stopped := h.checkpoint(sub); stopped == nil || p != pos {
				t.Errorf("after a failed re-delivery: checkpoint %d (was %d), stopped %v; want the partition halted again where it was", p, pos, stopped)
			}
			h.checkApplied(sub, all[:1])
			if t.Failed() {
				t.Logf("state:\n%s", h.dump())
			}
		})
	}
}

// The deadletter package's Retry and Skip release what the runner parked or
// stopped. (Its own results are the deadletter package's tests' business;
// here only what the runner does next.)
func TestFailureDeadLetterStore(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		// Skip the failed event of a parked stream: the parked events are
		// re-delivered in order, the skipped one never.
		t.Run("Skip/"+k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub = "parker"
			handler, fh := h.handler(k, sub, failOn("bad", 2))
			run := h.newRunner(projection.RetryPolicy{MaxRetries: -1}, -1,
				failReg{handler, &projection.Options{OnDeadLetter: projection.ParkStream}})
			all := h.appendTo("bad", "bad", "bad", "good", "bad")
			h.start(run)
			h.waitFor(failWait, "the stream to be parked", func() bool {
				return len(h.deadLetters(sub)) == 3 && len(h.seen(sub)) == 2
			})
			dls := h.deadLetters(sub)
			store, err := deadletter.New(h.pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.Skip(context.Background(), dls[0].ID); err != nil {
				t.Fatal(err)
			}
			want := slices.Delete(slices.Clone(all), 1, 2)
			h.waitFor(failWait, "the re-delivery", func() bool { return len(h.seen(sub)) == len(want) })
			want = append(want, h.appendTo("bad")...)
			h.waitFor(failWait, "a new event of the stream", func() bool { return len(h.seen(sub)) == len(want) })
			h.checkApplied(sub, want)
			if n := fh.callsOf(all[1].ID); n != 1 {
				t.Errorf("the skipped event was handled %d times, want once (its failed attempt)", n)
			}
			var statuses []string
			for _, d := range h.deadLetters(sub) {
				statuses = append(statuses, d.Status)
			}
			if !slices.Equal(statuses, []string{"skipped", "resolved", "resolved"}) {
				t.Errorf("statuses %v, want skipped, resolved, resolved", statuses)
			}
		})

		// Retry a stopped subscriber's dead letter: it resumes.
		t.Run("Retry/"+k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub = "stopper"
			handler, fh := h.handler(k, sub, failOn("bad", 2))
			run := h.newRunner(projection.RetryPolicy{MaxRetries: -1}, -1,
				failReg{handler, &projection.Options{OnDeadLetter: projection.Stop}})
			all := h.appendTo("bad", "bad", "good", "bad")
			h.start(run)
			h.waitFor(failWait, "the stop", func() bool {
				_, stopped := h.checkpoint(sub)
				return stopped != nil
			})
			dls := h.deadLetters(sub)
			if len(dls) != 1 {
				t.Fatalf("dead letters %v, want one", dls)
			}
			store, err := deadletter.New(h.pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			fh.setFail(nil)
			if _, err := store.Retry(context.Background(), dls[0].ID); err != nil {
				t.Fatal(err)
			}
			h.waitFor(failWait, "the resumption", func() bool { return len(h.seen(sub)) == len(all) })
			h.checkApplied(sub, all)
			if d := h.deadLetters(sub); len(d) != 1 || d[0].Status != "resolved" {
				t.Errorf("dead letters %v, want one, resolved", d)
			}
			if _, stopped := h.checkpoint(sub); stopped != nil {
				t.Errorf("still stopped: %q", *stopped)
			}
		})
	}
}
