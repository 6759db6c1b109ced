package natsconsumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/relay"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// tallyIn is the tally projection writing to a table of its own (its
// name), so that several consumers tally in one database.
type tallyIn string

func (p tallyIn) Name() string { return string(p) }

func (p tallyIn) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s (pos, n) VALUES ($1, 1) ON CONFLICT (pos) DO UPDATE SET n = %[1]s.n + 1`,
		pgx.Identifier{string(p)}.Sanitize()), e.GlobalSequence)
	return err
}

// tallied is the table as "position:times,…" in position order.
func (p tallyIn) tallied(ctx context.Context, pool *pgxpool.Pool) string {
	var s string
	_ = pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(string_agg(pos || ':' || n, ',' ORDER BY pos), '') FROM %s`,
		pgx.Identifier{string(p)}.Sanitize())).Scan(&s)
	return s
}

// TestARewoundLogStopsAtTheNewStream: the source log (10 events relayed) is
// rewound to 6, as a restore from a backup or a failover to an asynchronous
// replica leaves it, and 30 new events take positions 7 to 36. The relay
// refuses its stream and records that it and the log last agree at 6; the
// operator deletes the stream and sets the relay's checkpoint to 0, and the
// relay, restarted, publishes the rewound log into a stream made anew,
// stamped with 6.
// A RunProjection whose checkpoint is at 10, far behind the new head,
// stops at once with ErrLogRewound (a *RewoundError, Stamped, Agreed 6,
// Position 10), and again at its next start, before it reads anything of
// the new stream: its durable consumer there has nothing delivered or
// acknowledged, and the read model holds 1..10 once. A Run that was
// running when the stream was made again stops alike. A RunProjection at
// 6 (the agreed position) carries on: it passes over 1..6 and handles the
// new 7..36. Before, the consumer at 10 acknowledged the new events 7, 8
// and 9 without handling them, as events handled before, and stopped only
// at 10 (the new log reaching its position with another event); with the
// new log not yet past 10 it would not have stopped at all.
func TestARewoundLogStopsAtTheNewStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	near, far := tallyIn("near_tally"), tallyIn("far_tally")
	for _, p := range []tallyIn{near, far} {
		if _, err := e.dst.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (pos bigint PRIMARY KEY, n int NOT NULL)`, pgx.Identifier{string(p)}.Sanitize())); err != nil {
			t.Fatal(err)
		}
	}
	consumer := func(durable string) *natsconsumer.Consumer {
		t.Helper()
		c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: durable, Batch: 4, RetryBackoff: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	project := func(p tallyIn, want string) {
		t.Helper()
		stop := start(ctx, func(ctx context.Context) error { return consumer(string(p)).RunProjection(ctx, e.dst.Pool, p) })
		annalstest.WaitFor(t, 20*time.Second, func() bool { return p.tallied(ctx, e.dst.Pool) == want })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	e.appendAndRelay(t, ctx, 6)
	project(near, once(6))
	e.appendAndRelay(t, ctx, 4)
	project(far, once(10))
	var old []eventstore.Event
	for ev, err := range e.store.ReadAll(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		old = append(old, ev)
	}
	var mu sync.Mutex
	seen := map[int64]int{}
	runErr := make(chan error, 1)
	rc := consumer("run")
	go func() {
		runErr <- rc.Run(ctx, func(_ context.Context, ev eventstore.Event) error {
			mu.Lock()
			defer mu.Unlock()
			seen[ev.GlobalSequence]++
			return nil
		})
	}()
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == 10
	})

	// The log rewound to 6; 30 new events at 7..36.
	annalstest.RewindLog(t, e.src.Pool, "annals", 6)
	e.appendEvents(t, ctx, 30)
	if err := e.r.CatchUp(ctx); !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "last agree at position 6") {
		t.Fatalf("the relay on the rewound log: %v; want ErrStreamMismatch, saying where the stream and the log agree (6)", err)
	}
	e.deleteStream(t, ctx)
	if _, err := e.src.Pool.Exec(ctx, `UPDATE annals.checkpoints SET position = 0 WHERE subscriber_id = 'relay'`); err != nil {
		t.Fatal(err)
	}
	// A relay process started after the refusal: the rewind is recorded in
	// the database, not its memory.
	restarted, err := relay.New(e.src.Pool, e.nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}

	check := func(what string, err error) {
		t.Helper()
		var rw *natsconsumer.RewoundError
		if !errors.Is(err, natsconsumer.ErrLogRewound) || !errors.As(err, &rw) || !rw.Stamped || rw.Agreed != 6 || rw.Position != 10 {
			t.Fatalf("%s: %v (%+v); want ErrLogRewound from the new stream's stamp: agreed 6, the consumer at 10", what, err, rw)
		}
	}
	// untouched: the durable consumer on the new stream has read nothing;
	// made (made: by New on a restart, which knows no place yet) or not (a
	// running consumer stops before it makes it).
	untouched := func(durable string, made bool) {
		t.Helper()
		c, err := e.js.Consumer(ctx, "ANNALS", durable)
		if errors.Is(err, jetstream.ErrConsumerNotFound) && !made {
			return
		}
		if err == nil && !made {
			t.Fatalf("consumer %s was made on the new stream", durable)
		}
		if err != nil {
			t.Fatal(err)
		}
		if info := c.CachedInfo(); info.Delivered.Stream != 0 || info.AckFloor.Stream != 0 {
			t.Fatalf("consumer %s on the new stream: delivered through %d, acknowledged through %d; want nothing read",
				durable, info.Delivered.Stream, info.AckFloor.Stream)
		}
	}
	pc := consumer(string(far))
	err = pc.RunProjection(ctx, e.dst.Pool, far)
	check("RunProjection at 10", err)
	var rw *natsconsumer.RewoundError
	if errors.As(err, &rw) && rw.Handled != old[9].ID {
		t.Errorf("RewoundError.Handled %s, want event 10's %s", rw.Handled, old[9].ID)
	}
	untouched(string(far), true)
	check("RunProjection at 10 again", pc.RunProjection(ctx, e.dst.Pool, far))
	untouched(string(far), true)
	if got := far.tallied(ctx, e.dst.Pool); got != once(10) {
		t.Errorf("the read model at 10 holds %s after the stop, want 1..10 once", got)
	}
	select {
	case err := <-runErr:
		check("Run", err)
	case <-ctx.Done():
		t.Fatal("Run did not stop")
	}
	untouched("run", false)
	mu.Lock()
	if len(seen) != 10 || seen[11] != 0 {
		t.Errorf("Run handled %v, want 1..10 only", seen)
	}
	mu.Unlock()

	// At the agreed position: no alarm, the new events handled.
	project(near, once(36))

	// The new stream lost in turn and made again: it carries the stamp
	// too (the rewind stays recorded), which does not concern a consumer
	// whose place is in a stream made after the one found rewound.
	e.deleteStream(t, ctx)
	if _, err := e.src.Pool.Exec(ctx, `UPDATE annals.checkpoints SET position = 0 WHERE subscriber_id = 'relay'`); err != nil {
		t.Fatal(err)
	}
	e.appendAndRelay(t, ctx, 2)
	s, err := e.js.Stream(ctx, "ANNALS")
	if err != nil {
		t.Fatal(err)
	}
	if rs, ok, err := relay.RewindsOf(s.CachedInfo().Config.Metadata); err != nil || !ok || len(rs) != 1 || rs[0].At != 6 {
		t.Fatalf("the stream made again once more is stamped %+v (%v, %v), want the rewind at 6", rs, ok, err)
	}
	project(near, once(38))
}
