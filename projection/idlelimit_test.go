package projection_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// idleProbe records in idle_seen, per handler call, the
// idle_in_transaction_session_timeout its transaction runs under: read by
// the batch's first statement, an Exec with an argument (pipelined with
// BEGIN), or for stream "query" by a QueryRow (BEGIN sent first). The
// first attempt at an event of stream "fail" fails for good while failing
// is set.
type idleProbe struct {
	pool    *pgxpool.Pool
	failing atomic.Bool
}

func (p *idleProbe) Name() string { return "idleprobe" }

func (p *idleProbe) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if e.StreamID == "fail" && p.failing.Load() {
		return annals.Permanent(errors.New("fails until retried"))
	}
	if e.StreamID == "query" {
		var s string
		if err := tx.QueryRow(ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&s); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO idle_seen (stream, setting) VALUES ($1, $2)`, e.StreamID, s)
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO idle_seen (stream, setting) SELECT $1, current_setting('idle_in_transaction_session_timeout')`, e.StreamID)
	return err
}

func (p *idleProbe) Reset(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `DELETE FROM idle_seen`)
	return err
}

// calls returns the settings stream's handler calls saw, in order.
func (p *idleProbe) calls(t *testing.T, stream string) []string {
	t.Helper()
	rows, err := p.pool.Query(t.Context(), `SELECT setting FROM idle_seen WHERE stream = $1 ORDER BY id`, stream)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A leader's transactions that run handlers (its batches, a rebuild's
// batches on its lock session, the re-delivery of a dead letter) end a
// session left idle in them for the handler timeout plus the lock's
// FreezeTimeout (idle_in_transaction_session_timeout, set in BEGIN's round
// trip): a frozen leader's transaction does not hold its rows for ever.
// Without a handler timeout, or with FreezeTimeout -1, nothing is set (the
// server's default, 0, stays); a shorter limit of the session's own (a
// role's setting) stays.
func TestHandlerTransactionsIdleLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		handler time.Duration
		freeze  time.Duration
		session string // the sessions' own idle_in_transaction_session_timeout ("": none)
		want    string
	}{
		{"defaults", 0, 0, "", "1min"}, // 30s + 30s
		{"handler timeout and freeze timeout", 7 * time.Second, 2 * time.Second, "", "9s"},
		{"no handler timeout", math.MaxInt64, 0, "", "0"},
		{"no freeze timeout", 7 * time.Second, -1, "", "0"},
		{"a shorter limit of the session's stays", 7 * time.Second, 2 * time.Second, "8500ms", "8500ms"},
		{"a longer limit of the session's gives way", 7 * time.Second, 2 * time.Second, "10s", "9s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := t.Context()
			for _, stream := range []string{"exec", "query", "fail"} {
				if _, err := b.store.Append(ctx, stream, eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := b.db.Pool.Exec(ctx, `CREATE TABLE idle_seen (id bigserial PRIMARY KEY, stream text NOT NULL, setting text NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			pool := b.db.Pool
			if tc.session != "" {
				// As a role's setting (ALTER ROLE … SET) would be.
				cfg, err := pgxpool.ParseConfig(b.db.URL)
				if err != nil {
					t.Fatal(err)
				}
				cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = tc.session
				if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
					t.Fatal(err)
				}
				defer pool.Close()
			}
			p := &idleProbe{pool: b.db.Pool}
			p.failing.Store(true)
			r, err := projection.NewRunner(pool, &projection.Config{
				PollInterval: 50 * time.Millisecond, ShutdownTimeout: time.Second,
				Lock: &advisorylock.Config{FreezeTimeout: tc.freeze},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Register(p, &projection.Options{BatchSize: 1, HandlerTimeout: tc.handler, OnDeadLetter: projection.SkipEvent}); err != nil {
				t.Fatal(err)
			}
			if err := r.RunUntilCaughtUp(ctx); err != nil {
				t.Fatal(err)
			}
			check := func(path, stream string, n int) {
				t.Helper()
				got := p.calls(t, stream)
				if len(got) != n {
					t.Fatalf("%s: %d handler calls for stream %s, want %d", path, len(got), stream, n)
				}
				if n > 0 && got[n-1] != tc.want {
					t.Errorf("%s: idle_in_transaction_session_timeout %q, want %q", path, got[n-1], tc.want)
				}
			}
			check("a batch whose first statement is pipelined with BEGIN", "exec", 1)
			check("a batch that begins before its first statement", "query", 1)
			check("a dead-lettered event", "fail", 0)

			// The dead letter, retried, is re-delivered in a transaction of
			// its own.
			p.failing.Store(false)
			dls, err := deadletter.New(b.db.Pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			page, err := dls.List(ctx, deadletter.Filter{Subscriber: "idleprobe"})
			if err != nil || len(page.DeadLetters) != 1 {
				t.Fatalf("dead letters %+v (%v), want 1", page.DeadLetters, err)
			}
			if _, err := dls.Retry(ctx, page.DeadLetters[0].ID); err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Run(rctx) }()
			if _, ok := eventually(20*time.Second, func() bool { return len(p.calls(t, "fail")) > 0 }); !ok {
				t.Fatal("the retried dead letter was not re-delivered within 20s")
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			check("a re-delivery", "fail", 1)

			// A rebuild's batches run on its lock's own session.
			if err := r.Rebuild(ctx, "idleprobe", nil); err != nil {
				t.Fatal(err)
			}
			check("a rebuild's batch (BEGIN sent first)", "exec", 1)
			check("a rebuild's batch", "query", 1)
			check("a rebuild's batch", "fail", 1)
		})
	}
}

// slowProbe writes each event (idle_seen, its stream), except those of
// streams "slow-N" after "slow-0", and then works for pause without a
// statement: handlers that together send nothing for far longer than the
// transaction's idle limit, each within its HandlerTimeout.
// An event of stream "overrun" instead works for overrun, ignoring its
// context, and returns nil.
type slowProbe struct {
	pause, overrun time.Duration
	calls          atomic.Int64
}

func (p *slowProbe) Name() string { return "slowprobe" }

func (p *slowProbe) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	p.calls.Add(1)
	// Of the slow ones, only the first writes: the others send nothing.
	if !strings.HasPrefix(e.StreamID, "slow-") || e.StreamID == "slow-0" {
		if _, err := tx.Exec(ctx, `INSERT INTO idle_seen (stream, setting) VALUES ($1, $2)`, e.StreamID, e.ID.String()); err != nil {
			return err
		}
	}
	if e.StreamID == "overrun" {
		time.Sleep(p.overrun) // a handler that ignores its context: not a wait for a condition
		return nil
	}
	select {
	case <-time.After(p.pause): // the handler's work, not a wait for a condition
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *slowProbe) Reset(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `DELETE FROM idle_seen`)
	return err
}

// The idle limit is per gap between two statements, and a batch's handlers
// may run one after another without any: a batch pings its transaction
// between two handler calls when it has sent nothing for a third of
// FreezeTimeout, so handlers that each stay within their HandlerTimeout
// never add up to the limit, in a runner's batch as in a rebuild's (whose
// transaction begins before its first handler). Without the pings the
// server ended such a batch's session, and the batch failed again at
// every retry.
func TestHandlersWithoutStatementsDoNotAddUpToTheIdleLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if _, err := b.db.Pool.Exec(ctx, `CREATE TABLE idle_seen (id bigserial PRIMARY KEY, stream text NOT NULL, setting text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// 6 events of 600 ms each: 3.6 s in one batch, against a limit of
	// 2 s (HandlerTimeout 1 s + FreezeTimeout 1 s).
	for i := range 6 {
		if _, err := b.store.Append(ctx, fmt.Sprintf("slow-%d", i), eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
			t.Fatal(err)
		}
	}
	p := &slowProbe{pause: 600 * time.Millisecond}
	r, err := projection.NewRunner(b.db.Pool, &projection.Config{
		RetryBackoff: 100 * time.Millisecond, ShutdownTimeout: time.Second,
		Lock: &advisorylock.Config{FreezeTimeout: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(p, &projection.Options{BatchSize: 10, HandlerTimeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		if n := p.calls.Load(); n != 6 {
			t.Errorf("%s: %d handler calls for 6 events, want 6 (a batch failed and was retried)", what, n)
		}
		var rows int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM idle_seen`).Scan(&rows); err != nil || rows != 1 {
			t.Fatalf("%s: %d rows applied (%v), want 1", what, rows, err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := r.RunUntilCaughtUp(rctx); err != nil {
		t.Fatalf("the runner's batch: %v", err)
	}
	check("the runner's batch")
	p.calls.Store(0)
	if err := r.Rebuild(rctx, "slowprobe", nil); err != nil {
		t.Fatalf("the rebuild's batch: %v", err)
	}
	check("the rebuild's batch")
}

// A handler that ignores its context and returns nil long after its
// HandlerTimeout, its batch's transaction idle meanwhile, may have had its
// session ended by the server (the transaction's idle limit): its call is a
// timed-out attempt, retried by the RetryPolicy and in the end
// dead-lettered, like a handler that returns its context's error. Before,
// the failure showed only at the next statement, as a lost connection,
// which is nobody's fault: the batch was retried for ever.
func TestHandlerThatOverrunsItsTimeoutIdleFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if _, err := b.db.Pool.Exec(ctx, `CREATE TABLE idle_seen (id bigserial PRIMARY KEY, stream text NOT NULL, setting text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for _, stream := range []string{"before", "overrun", "after"} {
		if _, err := b.store.Append(ctx, stream, eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
			t.Fatal(err)
		}
	}
	// HandlerTimeout 1 s + FreezeTimeout 1 s: the server ends a
	// transaction idle for 2 s; the handler works 2.5 s.
	p := &slowProbe{overrun: 2500 * time.Millisecond}
	r, err := projection.NewRunner(b.db.Pool, &projection.Config{
		PollInterval: 50 * time.Millisecond, RetryBackoff: 100 * time.Millisecond, ShutdownTimeout: time.Second,
		Retry: &projection.RetryPolicy{MaxRetries: 1, InitialDelay: 50 * time.Millisecond, Jitter: -1},
		Lock:  &advisorylock.Config{FreezeTimeout: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(p, &projection.Options{BatchSize: 10, HandlerTimeout: time.Second, OnDeadLetter: projection.SkipEvent}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	var dead int
	var why string
	if _, ok := eventually(30*time.Second, func() bool {
		err := b.db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(max(error), '') FROM annals.dead_letters WHERE subscriber_id = 'slowprobe'`).Scan(&dead, &why)
		return err == nil && dead > 0
	}); !ok {
		t.Fatalf("the overrunning event was not dead-lettered within 30s (%d handler calls)", p.calls.Load())
	}
	if !strings.Contains(why, "past its HandlerTimeout") {
		t.Errorf("the dead letter's error %q does not say the handler overran its timeout", why)
	}
	var streams []string
	if _, ok := eventually(10*time.Second, func() bool {
		rows, err := b.db.Pool.Query(ctx, `SELECT stream FROM idle_seen ORDER BY id`)
		if err != nil {
			return false
		}
		streams, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err == nil && len(streams) == 2
	}); !ok || streams[0] != "before" || streams[1] != "after" {
		t.Fatalf("applied %v, want [before after]", streams)
	}
}
