package projection_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/testkit"
)

// The tests of failures that show only when a batch's transaction commits:
// a deferred constraint, a handler that ignored a failed statement's error.

// keyedProjection applies an event by writing it to seen and its "key" to
// the table keyed, whose uniqueness the test's setup makes deferred (checked
// at COMMIT) or immediate. With swallow, the handler ignores the error of
// the keyed insert and returns nil.
type keyedProjection struct {
	name    string
	swallow bool
}

func (p keyedProjection) Name() string { return p.name }

func (p keyedProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	var d struct {
		Key int `json:"key"`
	}
	if err := json.Unmarshal(e.Data, &d); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, failInsertSeen, p.name, e.ID, e.GlobalSequence, e.StreamID, e.StreamVersion); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO keyed (key) VALUES ($1)`, d.Key)
	if p.swallow {
		return nil // the mistake under test: the statement's error is dropped
	}
	return err
}

// keyed is an event to append: its stream and key.
type keyed struct {
	stream string
	key    int
}

// appendKeyed appends one event per entry, one append each.
func (h *failHarness) appendKeyed(evs ...keyed) []failEv {
	h.t.Helper()
	out := make([]failEv, 0, len(evs))
	for _, k := range evs {
		res, err := h.store.Append(context.Background(), k.stream, eventstore.Any,
			eventstore.EventData{Type: "acct.keyed", Data: map[string]int{"key": k.key}})
		if err != nil {
			h.t.Fatal(err)
		}
		a := res.Events[0]
		out = append(out, failEv{ID: a.ID, Pos: a.GlobalSequence, Stream: k.stream, Version: a.StreamVersion})
	}
	return out
}

// A projection whose transaction fails at COMMIT (a deferred unique
// constraint), or whose handler ignores a failed statement (the transaction
// is aborted, and the commit fails with 25P02), has the event to blame
// narrowed down: that event's failure is recorded, retried by the policy and
// dead-lettered (its stream parked), while the events before it in the batch
// and the other streams' events are applied exactly once and the checkpoint
// reaches the head. Without the narrowing the batch was retried every
// RetryBackoff for ever, with nothing recorded.
func TestCommitFailureIsTheEventsFailure(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		table   string
		swallow bool
		want    []string // in the dead letter's error
	}{
		{"DeferredConstraint", `CREATE TABLE keyed (key int, CONSTRAINT keyed_u UNIQUE (key) DEFERRABLE INITIALLY DEFERRED)`, false,
			[]string{"could not commit", `"keyed_u"`, "23505", "bad v1"}},
		{"IgnoredStatementError", `CREATE TABLE keyed (key int PRIMARY KEY)`, true,
			[]string{"could not commit", "ignored the statement's error", "25P02", "bad v1"}},
	} {
		for _, size := range []struct {
			name  string
			evs   []keyed
			batch int
		}{
			// The failing event in the middle of one batch.
			{"Small", []keyed{{"s-a", 1}, {"s-a", 2}, {"bad", 1}, {"bad", 4}, {"s-b", 3}}, 0},
			// Many events: the narrowing halves the batch several times;
			// the batch size cuts it so that the failing event is at the end
			// of the first batch.
			{"Large", func() []keyed {
				var evs []keyed
				for i := range 40 {
					evs = append(evs, keyed{fmt.Sprintf("g-%d", i%3), 100 + i})
					if i == 28 {
						evs = append(evs, keyed{"bad", 100 + 5}, keyed{"bad", 1000})
					}
				}
				return evs
			}(), 30},
		} {
			t.Run(c.name+"/"+size.name, func(t *testing.T) {
				t.Parallel()
				h := newFailHarness(t)
				if _, err := h.pool.Exec(t.Context(), c.table); err != nil {
					t.Fatal(err)
				}
				const sub = "keyed"
				evs := h.appendKeyed(size.evs...)
				run := h.newRunner(projection.RetryPolicy{MaxRetries: 1, Jitter: -1}, -1,
					failReg{keyedProjection{sub, c.swallow}, &projection.Options{BatchSize: size.batch}})
				if err := run.catchUp(); err != nil {
					t.Fatalf("RunUntilCaughtUp: %v\n%s", err, h.dump())
				}
				var bad, parked failEv
				var good []failEv
				for _, e := range evs {
					switch {
					case e.Stream == "bad" && e.Version == 1:
						bad = e
					case e.Stream == "bad":
						parked = e
					default:
						good = append(good, e)
					}
				}
				h.checkApplied(sub, good)
				if n := h.queryInt(`SELECT count(*) FROM keyed`); n != int64(len(good)) {
					t.Errorf("keyed holds %d rows, want %d", n, len(good))
				}
				if pos, stopped := h.checkpoint(sub); pos != evs[len(evs)-1].Pos || stopped != nil {
					t.Errorf("checkpoint %d (stopped %v), want the head %d", pos, stopped, evs[len(evs)-1].Pos)
				}
				dls := h.deadLetters(sub)
				if len(dls) != 2 {
					t.Fatalf("dead letters %v, want the failing event and the one parked behind it\n%s", dls, h.dump())
				}
				h.checkFailedAt(dls[0], bad, 2, "process.go")
				for _, s := range c.want {
					if !strings.Contains(dls[0].Error, s) {
						t.Errorf("the dead letter's error %q does not say %q", dls[0].Error, s)
					}
				}
				if dls[1].EventID != parked.ID || dls[1].Reason != "parked" {
					t.Errorf("second dead letter %v, want %v parked", dls[1], parked)
				}
				if got := h.attempts(sub, bad.ID); !slices.Equal(got, []int{1, 2}) {
					t.Errorf("failures attempts %v, want [1 2]", got)
				}
				retries, _ := run.hooks.calls()
				if len(retries) != 1 || retries[0].Pos != bad.Pos || !strings.Contains(retries[0].Err, "could not commit") {
					t.Errorf("OnRetry calls %+v, want one for %v at commit", retries, bad)
				}
				if t.Failed() {
					t.Logf("state:\n%s", h.dump())
				}
			})
		}
	}
}

// A handler that ignores a failed statement, and a later handler of the
// same batch that reports the 25P02 its own statement got because of it:
// the event to blame is the first one (the later one is applied), and its
// error says why.
func TestCommitFailureBlamesTheHandlerThatIgnoredTheError(t *testing.T) {
	t.Parallel()
	h := newFailHarness(t)
	if _, err := h.pool.Exec(t.Context(), `CREATE TABLE keyed (key int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	const sub = "mixed"
	// Stream "quiet" swallows its insert's error; the others report theirs.
	p := keyedMixed{sub}
	evs := h.appendKeyed(keyed{"s-a", 1}, keyed{"quiet", 1}, keyed{"s-b", 2}, keyed{"s-c", 3})
	run := h.newRunner(projection.RetryPolicy{MaxRetries: -1}, -1,
		failReg{p, &projection.Options{OnDeadLetter: projection.SkipEvent}})
	if err := run.catchUp(); err != nil {
		t.Fatalf("RunUntilCaughtUp: %v\n%s", err, h.dump())
	}
	h.checkApplied(sub, []failEv{evs[0], evs[2], evs[3]})
	dls := h.deadLetters(sub)
	if len(dls) != 1 || dls[0].EventID != evs[1].ID || !strings.Contains(dls[0].Error, "ignored the statement's error") {
		t.Errorf("dead letters %v (%q), want only %v, for ignoring an error\n%s", dls, dls, evs[1], h.dump())
	}
}

// keyedMixed is keyedProjection, swallowing errors for the stream "quiet"
// only.
type keyedMixed struct{ name string }

func (p keyedMixed) Name() string { return p.name }

func (p keyedMixed) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	return keyedProjection{p.name, e.StreamID == "quiet"}.Handle(ctx, tx, e)
}

// A released dead letter whose re-delivery still fails at commit is open
// again, with the failed attempt recorded, instead of being re-delivered
// every RetryBackoff for ever; once the cause is gone, it is applied.
func TestCommitFailureOnRedelivery(t *testing.T) {
	t.Parallel()
	h := newFailHarness(t)
	if _, err := h.pool.Exec(t.Context(),
		`CREATE TABLE keyed (key int, CONSTRAINT keyed_u UNIQUE (key) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	const sub = "redeliver"
	evs := h.appendKeyed(keyed{"s-a", 1}, keyed{"bad", 1}, keyed{"s-b", 2})
	run := h.newRunner(projection.RetryPolicy{MaxRetries: -1}, -1, failReg{keyedProjection{sub, false}, nil})
	h.start(run)
	h.waitFor(failWait, "the dead letter", func() bool {
		dls := h.deadLetters(sub)
		return len(dls) == 1 && dls[0].Status == "open" && len(h.seen(sub)) == 2
	})
	h.release(sub, "bad") // the constraint still fails at commit
	h.waitFor(failWait, "the failed re-delivery", func() bool {
		dls := h.deadLetters(sub)
		return len(dls) == 1 && dls[0].Attempts == 2 && dls[0].Status == "open"
	})
	if dl := h.deadLetters(sub)[0]; !strings.Contains(dl.Error, "re-delivery") || !strings.Contains(dl.Error, "could not commit") ||
		!strings.Contains(dl.Error, `"keyed_u"`) {
		t.Errorf("the reopened dead letter's error %q does not say that the re-delivery could not commit", dl.Error)
	}
	if _, err := h.pool.Exec(t.Context(), `DELETE FROM keyed WHERE key = 1`); err != nil {
		t.Fatal(err)
	}
	h.release(sub, "bad")
	h.waitFor(failWait, "the re-delivery", func() bool {
		dls := h.deadLetters(sub)
		return len(dls) == 1 && dls[0].Status == "resolved"
	})
	h.checkApplied(sub, evs)
}

// Connection-level failures at commit are not blamed on an event: a batch
// whose connection is terminated after its handlers returned (its commit
// gets no answer, or the server's 57P01), three times in a row, is retried
// as a whole, recording nothing, and applied once. (Were such a failure
// narrowed down like a deferred constraint's, the event's own transaction
// would fail too and be recorded as its failure.)
func TestCommitFailureOfTheConnectionIsRetried(t *testing.T) {
	t.Parallel()
	h := newFailHarness(t)
	const sub = "conn"
	evs := h.appendTo("s-a", "s-b", "s-c")
	p := &terminatingProjection{name: sub, pool: h.pool}
	run := h.newRunner(projection.RetryPolicy{MaxRetries: -1}, -1, failReg{p, nil})
	if err := run.catchUp(); err != nil {
		t.Fatalf("RunUntilCaughtUp: %v\n%s", err, h.dump())
	}
	if n := p.terminated.Load(); n != terminations {
		t.Fatalf("the batch's connection was terminated %d times, want %d", n, terminations)
	}
	h.checkApplied(sub, evs)
	if n := h.queryInt(`SELECT count(*) FROM annals.failures`); n != 0 {
		t.Errorf("%d failures rows, want none\n%s", n, h.dump())
	}
	if dls := h.deadLetters(sub); len(dls) != 0 {
		t.Errorf("dead letters %v, want none", dls)
	}
}

// terminations is how often terminatingProjection terminates its backend.
const terminations = 3

// terminatingProjection writes each event to seen and, at the first
// terminations deliveries of the event of stream s-c, terminates its
// transaction's backend from another connection and returns nil.
type terminatingProjection struct {
	name       string
	pool       *pgxpool.Pool
	terminated atomic.Int32
}

func (p *terminatingProjection) Name() string { return p.name }

func (p *terminatingProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if _, err := tx.Exec(ctx, failInsertSeen, p.name, e.ID, e.GlobalSequence, e.StreamID, e.StreamVersion); err != nil {
		return err
	}
	if e.StreamID != "s-c" || p.terminated.Load() >= terminations {
		return nil
	}
	p.terminated.Add(1) // one runner: its handler calls do not overlap
	var ok bool
	err := p.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 5000)`, tx.Conn().PgConn().PID()).Scan(&ok)
	if err == nil && !ok {
		err = errors.New("pg_terminate_backend returned false")
	}
	return err
}

// A failure of the batch's transaction that is PostgreSQL's answer about
// the runner rather than an event (here the fenced checkpoint UPDATE sent
// with the COMMIT is denied, 42501, as after a revoked privilege) is not
// blamed on an event, although nothing excluded it by name: the batch is
// retried as a whole, three times in a row, recording nothing, and then
// applied once. (Were it narrowed down, the last event's own transaction
// would fail too and be recorded as its failure.)
func TestCommitFailureOfTheCheckpointIsRetried(t *testing.T) {
	t.Parallel()
	h := newFailHarness(t)
	ctx := t.Context()
	role := pgx.Identifier{fmt.Sprintf("denied_%d_%d", time.Now().UnixNano(), h.queryInt(`SELECT pg_backend_pid()`))}.Sanitize()
	if _, err := h.pool.Exec(ctx, `CREATE ROLE `+role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := h.pool.Exec(context.Background(), `DROP ROLE `+role); err != nil {
			t.Errorf("dropping the role: %v", err)
		}
	})
	// SET ROLE needs membership unless the test's role is a superuser.
	if _, err := h.pool.Exec(ctx, `GRANT `+role+` TO CURRENT_USER`); err != nil {
		t.Fatal(err)
	}
	const sub = "denied"
	evs := h.appendTo("s-a", "s-b", "s-c")
	p := &denyingProjection{name: sub, role: role}
	run := h.newRunner(projection.RetryPolicy{MaxRetries: -1}, -1, failReg{p, nil})
	if err := run.catchUp(); err != nil {
		t.Fatalf("RunUntilCaughtUp: %v\n%s", err, h.dump())
	}
	if n := p.denied.Load(); n != denials {
		t.Fatalf("the batch's checkpoint was denied %d times, want %d\n%s", n, denials, h.dump())
	}
	h.checkApplied(sub, evs)
	if n := h.queryInt(`SELECT count(*) FROM annals.failures`); n != 0 {
		t.Errorf("%d failures rows, want none\n%s", n, h.dump())
	}
	if dls := h.deadLetters(sub); len(dls) != 0 {
		t.Errorf("dead letters %v, want none", dls)
	}
	if pos, stopped := h.checkpoint(sub); pos != evs[len(evs)-1].Pos || stopped != nil {
		t.Errorf("checkpoint %d (stopped %v), want the head %d", pos, stopped, evs[len(evs)-1].Pos)
	}
	if !strings.Contains(h.logs.tail(1000), "42501") {
		t.Errorf("the log does not quote the denial (42501):\n%s", h.logs.tail(20))
	}
}

// denials is how often denyingProjection denies its checkpoint.
const denials = 3

// denyingProjection writes each event to seen and, at the first denials
// deliveries of the event of stream s-c (the batch's last), switches its
// transaction to role, which has no privileges, and returns nil: the
// checkpoint UPDATE that follows the handlers is denied. The switch is
// SET LOCAL, undone by the rollback.
type denyingProjection struct {
	name   string
	role   string
	denied atomic.Int32
}

func (p *denyingProjection) Name() string { return p.name }

func (p *denyingProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if _, err := tx.Exec(ctx, failInsertSeen, p.name, e.ID, e.GlobalSequence, e.StreamID, e.StreamVersion); err != nil {
		return err
	}
	if e.StreamID != "s-c" || p.denied.Load() >= denials {
		return nil
	}
	p.denied.Add(1) // one runner: its handler calls do not overlap
	_, err := tx.Exec(ctx, `SET LOCAL ROLE `+p.role)
	return err
}

// commitTB records Fatalf instead of failing the test (testkit reports
// through it); everything else goes to the real test.
type commitTB struct {
	testing.TB
	mu     sync.Mutex
	fatals []string
}

func (f *commitTB) Helper() {}

func (f *commitTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
	f.mu.Unlock()
	panic(commitTBFatal{}) // as runtime.Goexit does in the real one: stop the caller
}

type commitTBFatal struct{}

type keyedEvent struct {
	Key int `json:"key"`
}

// testkit's ReplayProjection quotes a commit failure with its event at
// once, as it does a handler's error, instead of waiting out its Timeout
// and reporting only that the projection did not catch up.
func TestCommitFailureInTestkit(t *testing.T) {
	t.Parallel()
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[keyedEvent](reg, "test.keyed")
	p := projection.New("keyed_tk", reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE keyed_tk (key int, CONSTRAINT keyed_tk_u UNIQUE (key) DEFERRABLE INITIALLY DEFERRED)`))
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[keyedEvent]) error {
		_, err := tx.Exec(ctx, `INSERT INTO keyed_tk VALUES ($1)`, e.Data.Key)
		return err
	})
	ft := &commitTB{TB: t}
	start := time.Now()
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(commitTBFatal); !ok {
					panic(r)
				}
			}
		}()
		testkit.ReplayProjection(ft, p, &testkit.ReplayOptions{Registry: reg, Timeout: 20 * time.Second},
			testkit.Stream("s-a", keyedEvent{1}, keyedEvent{2}),
			testkit.Stream("s-c", keyedEvent{1}),
			testkit.Stream("s-b", keyedEvent{3}))
	}()
	if len(ft.fatals) != 1 {
		t.Fatalf("fatals = %q, want one", ft.fatals)
	}
	for _, want := range []string{`projection "keyed_tk"`, "s-c v1", "could not commit", `"keyed_tk_u"`} {
		if !strings.Contains(ft.fatals[0], want) {
			t.Errorf("the failure %q does not say %q", ft.fatals[0], want)
		}
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("failing took %v", took)
	}
}
