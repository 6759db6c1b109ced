package projection_test

import (
	"context"
	"math"
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
			check("a rebuild's batch (pipelined)", "exec", 1)
			check("a rebuild's batch", "query", 1)
			check("a rebuild's batch", "fail", 1)
		})
	}
}
