package natsconsumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/natsserver"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/relay"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

const totalsTable = `CREATE TABLE totals (stream_id text PRIMARY KEY, n int NOT NULL, sum int NOT NULL, version bigint NOT NULL, pos bigint NOT NULL)`

func readTotals(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(json_agg(t ORDER BY stream_id)::text, '') FROM totals t`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestProjectionOverRelayedEvents: a projection run by natsconsumer in
// another database, over the events the relay published, ends equal to the
// same projection run by a Runner in the source database, although the
// consumer is stopped mid-way and started again (a new Consumer on the
// same durable) while more events are relayed: each event's effect is
// applied once, in stream-version order.
func TestProjectionOverRelayedEvents(t *testing.T) {
	t.Parallel()
	src := annalstest.NewDB(t, nil)
	dst := annalstest.NewDB(t, nil)
	for _, db := range []*annalstest.DB{src, dst} {
		if _, err := db.Pool.Exec(t.Context(), totalsTable); err != nil {
			t.Fatal(err)
		}
	}
	store, err := eventstore.New(src.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := natsserver.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	appendSome := func(from, n int) {
		for i := from; i < from+n; i++ {
			typ := "deposited"
			if i%5 == 0 {
				typ = "noted" // not handled: the consumer filters it out
			}
			if _, err := store.Append(ctx, fmt.Sprintf("acct-%d", i%7), eventstore.Any,
				eventstore.EventData{Type: typ, Data: map[string]int{"amount": i}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	r, err := relay.New(src.Pool, nc, &relay.Config{BatchSize: 50, PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	appendSome(0, 200)
	go func() { relayDone <- r.Run(relayCtx) }()

	consume := func() (stop func()) {
		c, err := natsconsumer.New(ctx, nc, &natsconsumer.Config{Durable: "totals", Types: []string{"deposited"}, Batch: 40})
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.RunProjection(cctx, dst.Pool, totals{}); err != nil {
				t.Error(err)
			}
		}()
		return func() { cancel(); wg.Wait() }
	}
	stop := consume()
	applied := func() int64 {
		var n int64
		_ = dst.Pool.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM totals`).Scan(&n)
		return n
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool { return applied() >= 60 })
	stop()
	appendSome(200, 300)
	stop = consume()
	annalstest.WaitFor(t, 30*time.Second, func() bool { return applied() == 400 })
	stop()
	stopRelay()
	if err := <-relayDone; err != nil {
		t.Fatal(err)
	}

	// The same projection in the source database, through a Runner.
	runner, err := projection.NewRunner(src.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.Register(totals{}, &projection.Options{Types: []string{"deposited"}}); err != nil {
		t.Fatal(err)
	}
	if err := runner.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	want, got := readTotals(t, src.Pool), readTotals(t, dst.Pool)
	if got != want || want == "" {
		t.Fatalf("the projection over relayed events:\n%s\nin the source database:\n%s", got, want)
	}
}

// totals is a projection: per stream, the count and sum of "amount" over
// the events it gets, and the last version and position applied. A stream's
// positions must only grow (per-stream order), or Handle fails.
type totals struct{}

func (totals) Name() string { return "totals" }

func (totals) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	var d struct{ Amount int }
	if err := json.Unmarshal(e.Data, &d); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, `INSERT INTO totals (stream_id, n, sum, version, pos) VALUES ($1, 1, $2, $3, $4)
		ON CONFLICT (stream_id) DO UPDATE SET n = totals.n + 1, sum = totals.sum + excluded.sum,
		       version = excluded.version, pos = excluded.pos
		 WHERE totals.pos < excluded.pos AND totals.version < excluded.version`,
		e.StreamID, d.Amount, e.StreamVersion, e.GlobalSequence)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("stream %s: event %d (version %d) out of order", e.StreamID, e.GlobalSequence, e.StreamVersion)
	}
	return err
}

// TestRunProjectionAfterACrash: a process that fetched messages and died
// leaves them unacknowledged until AckWait, and the server meanwhile
// delivers the messages after them (and re-delivers the fetched ones behind
// those). The next RunProjection reads the missing messages from the stream
// by sequence and handles them first: every event once, in order, without
// waiting for AckWait. Before, with no checkpoint yet it handled the later
// messages and then acknowledged the re-delivered earlier ones unhandled
// (lost); with a checkpoint it refused the later ones (Nak) and the server
// kept sending them first, forever.
func TestRunProjectionAfterACrash(t *testing.T) {
	t.Parallel()
	src := annalstest.NewDB(t, nil)
	dst := annalstest.NewDB(t, nil)
	if _, err := dst.Pool.Exec(t.Context(), totalsTable); err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(src.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := natsserver.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := relay.New(src.Pool, nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	appendAndRelay := func(n int) {
		t.Helper()
		for range n {
			if _, err := store.Append(ctx, "acct-0", eventstore.Any,
				eventstore.EventData{Type: "deposited", Data: map[string]int{"amount": 1}}); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
	}
	const ackWait = 20 * time.Second // longer than the test waits: nothing is re-delivered in time
	cfg := &natsconsumer.Config{Durable: "totals", Batch: 10, AckWait: ackWait}
	// crash fetches n messages on the durable consumer and never
	// acknowledges them, as a process that died after its fetch.
	crash := func(n int) {
		t.Helper()
		if _, err := natsconsumer.New(ctx, nc, cfg); err != nil { // creates the durable consumer
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := js.Consumer(ctx, "ANNALS", "totals")
		if err != nil {
			t.Fatal(err)
		}
		batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for range batch.Messages() {
			got++
		}
		if got != n {
			t.Fatalf("the crashed fetch got %d messages, want %d", got, n)
		}
	}
	applied := func() (n, version int64) {
		_ = dst.Pool.QueryRow(ctx, `SELECT coalesce(sum(n), 0), coalesce(max(version), 0) FROM totals`).Scan(&n, &version)
		return n, version
	}
	consume := func(want int64) {
		t.Helper()
		c, err := natsconsumer.New(ctx, nc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		cctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.RunProjection(cctx, dst.Pool, totals{}) }()
		annalstest.WaitFor(t, 15*time.Second, func() bool { n, v := applied(); return n == want && v == want })
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}

	// No checkpoint yet: 1-3 fetched by the crashed process, 4-8 after.
	appendAndRelay(3)
	crash(3)
	appendAndRelay(5)
	consume(8)
	// A checkpoint (8): 9-11 fetched by the crashed process, 12-16 after.
	appendAndRelay(3)
	crash(3)
	appendAndRelay(5)
	consume(16)
}
