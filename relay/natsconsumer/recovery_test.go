package natsconsumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/natsserver"
	"github.com/annals-dev/annals/relay"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// logBuffer is a log destination the test reads while the consumer writes.
type logBuffer struct{ annalstest.LogBuffer }

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// env is a source database with a relay, a NATS server, and a service
// database with the tally and totals tables.
type env struct {
	src, dst *annalstest.DB
	store    *eventstore.Store
	ns       *natsserver.Server
	nc       *nats.Conn
	js       jetstream.JetStream
	r        *relay.Relay
}

func newEnv(t testing.TB) *env {
	t.Helper()
	src := annalstest.NewDB(t, nil)
	dst := annalstest.NewDB(t, nil)
	for _, ddl := range []string{totalsTable, tallyTable} {
		if _, err := dst.Pool.Exec(t.Context(), ddl); err != nil {
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
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(src.Pool, nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &env{src: src, dst: dst, store: store, ns: ns, nc: nc, js: js, r: r}
}

// appendEvents appends n "deposited" events to acct-0.
func (e *env) appendEvents(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	for range n {
		if _, err := e.store.Append(ctx, "acct-0", eventstore.Any,
			eventstore.EventData{Type: "deposited", Data: map[string]int{"amount": 1}}); err != nil {
			t.Fatal(err)
		}
	}
}

// appendAndRelay appends n events and relays every event not relayed yet.
func (e *env) appendAndRelay(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	e.appendEvents(t, ctx, n)
	if err := e.r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
}

// applied is the count and the last version in the totals table.
func (e *env) applied(ctx context.Context) (n, version int64) {
	_ = e.dst.Pool.QueryRow(ctx, `SELECT coalesce(sum(n), 0), coalesce(max(version), 0) FROM totals`).Scan(&n, &version)
	return n, version
}

// tallied is the tally table as "position:times,…" in position order.
func (e *env) tallied(ctx context.Context) string {
	var s string
	_ = e.dst.Pool.QueryRow(ctx, `SELECT coalesce(string_agg(pos || ':' || n, ',' ORDER BY pos), '') FROM tally`).Scan(&s)
	return s
}

// once is the tally of positions 1..n handled once each.
func once(n int) string {
	var s []string
	for i := 1; i <= n; i++ {
		s = append(s, fmt.Sprintf("%d:1", i))
	}
	return strings.Join(s, ",")
}

// deleteStream deletes the relay's stream (its durable consumers go with it).
func (e *env) deleteStream(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := e.js.DeleteStream(ctx, "ANNALS"); err != nil {
		t.Fatal(err)
	}
}

// crash fetches n messages on the durable consumer (made already) and
// never acknowledges them, as a process that died after its fetch.
func (e *env) crash(t *testing.T, ctx context.Context, durable string, n int) {
	t.Helper()
	cons, err := e.js.Consumer(ctx, "ANNALS", durable)
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

// start runs f in a goroutine; the returned stop ends it and returns its error.
func start(ctx context.Context, f func(ctx context.Context) error) (stop func() error) {
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f(cctx) }()
	return func() error { cancel(); return <-done }
}

const tallyTable = `CREATE TABLE tally (pos bigint PRIMARY KEY, n int NOT NULL)`

// tally is a projection that counts how many times each position was
// handled.
type tally struct{}

func (tally) Name() string { return "tally" }

func (tally) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO tally (pos, n) VALUES ($1, 1) ON CONFLICT (pos) DO UPDATE SET n = tally.n + 1`, e.GlobalSequence)
	return err
}

// TestRunProjectionAfterACrashWithAFullBatch: a process that fetched a full
// batch (as many messages as the server lets out unacknowledged) and died
// leaves the server delivering nothing newer until AckWait. The next
// RunProjection sees the stream hold messages after its checkpoint while
// its fetches come back empty, and reads them from the stream by sequence:
// every event applied at once, not after AckWait (30 s here). Before, it
// waited for a later delivery to notice the gap, and none came until
// AckWait.
func TestRunProjectionAfterACrashWithAFullBatch(t *testing.T) {
	t.Parallel()
	restartAfterACrash(t, 10, 10, 5)
}

// restartAfterACrash relays first events, lets a process fetch fetched of
// them and die, relays then more, and requires a RunProjection started
// next to apply them all within 10 s (AckWait is 30 s).
func restartAfterACrash(t *testing.T, first, fetched, then int) {
	t.Helper()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := &natsconsumer.Config{Durable: "totals", Batch: 10, AckWait: 30 * time.Second}
	e.appendAndRelay(t, ctx, first)
	if _, err := natsconsumer.New(ctx, e.nc, cfg); err != nil { // makes the durable consumer
		t.Fatal(err)
	}
	e.crash(t, ctx, "totals", fetched)
	if then > 0 {
		e.appendAndRelay(t, ctx, then)
	}

	c, err := natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, totals{}) })
	all := int64(first + then)
	annalstest.WaitFor(t, 10*time.Second, func() bool { n, v := e.applied(ctx); return n == all && v == all })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestRunProjectionAfterACrashWithNothingPublishedSince: a process that
// fetched fewer messages than a full batch and died, with nothing published
// after them: no delivery comes to show they are missing (the server sends
// them again only after AckWait, 30 s here). The next RunProjection saw them
// pending at its start, asks the server about the consumer at its first
// empty fetch, and reads what it delivered past the checkpoint by sequence.
func TestRunProjectionAfterACrashWithNothingPublishedSince(t *testing.T) {
	t.Parallel()
	restartAfterACrash(t, 3, 3, 0)
}

// TestRunProjectionFollowsAStreamMadeAgain: the relay's stream is deleted
// under a running RunProjection, and the relay makes it again and publishes
// the next events (as stream sequences 1, 2, …). The consumer looks the
// stream up again, makes its durable consumer on the new one, says so, and
// applies the new events once each. Before, its fetches failed for ever
// ("consumer deleted", "no responders").
func TestRunProjectionFollowsAStreamMadeAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var logs logBuffer
	e.appendAndRelay(t, ctx, 10)
	c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "tally", Batch: 4, RetryBackoff: 100 * time.Millisecond, Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, tally{}) })
	annalstest.WaitFor(t, 10*time.Second, func() bool { return e.tallied(ctx) == once(10) })

	e.deleteStream(t, ctx)
	e.appendAndRelay(t, ctx, 5) // the relay makes the stream again: events 11..15 are its 1..5
	annalstest.WaitFor(t, 20*time.Second, func() bool { return e.tallied(ctx) == once(15) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "stream was made again") {
		t.Errorf("the log does not say the stream was made again:\n%s", logs.String())
	}
}

// TestRunProjectionAfterTheStreamWasMadeAgain: the relay's stream is deleted
// and made again while no consumer runs; the next RunProjection, whose
// checkpoint holds a sequence of the old stream (10), reads the new stream
// from its start and applies its events (11..15 as sequences 1..5). Before,
// it took them for re-deliveries at or below its checkpoint and
// acknowledged them unhandled: lost.
func TestRunProjectionAfterTheStreamWasMadeAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := &natsconsumer.Config{Durable: "tally", Batch: 4}
	e.appendAndRelay(t, ctx, 10)
	run := func() (stop func() error) {
		c, err := natsconsumer.New(ctx, e.nc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, tally{}) })
	}
	stop := run()
	annalstest.WaitFor(t, 10*time.Second, func() bool { return e.tallied(ctx) == once(10) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	e.deleteStream(t, ctx)
	e.appendAndRelay(t, ctx, 5)
	stop = run()
	annalstest.WaitFor(t, 20*time.Second, func() bool { return e.tallied(ctx) == once(15) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestEventsPublishedAgainAreNotHandledAgain: a stream made again may hold
// events the consumer has handled already (the relay's checkpoint set back,
// here: events 5..15 published by hand into the new stream, as sequences
// 1..11). A running Run and a restarted RunProjection hand over those at
// or below the last position they handled (acknowledged, not handled) and
// handle the rest once. Before, Run stalled, and RunProjection took
// sequences 1..10 (events 5..14) for re-deliveries: events 11..14 lost.
func TestEventsPublishedAgainAreNotHandledAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 10)

	// Run, at least once, keeps its place in memory.
	var mu sync.Mutex
	seen := map[int64]int{}
	saw := func() string {
		mu.Lock()
		defer mu.Unlock()
		var s []string
		for i := int64(1); i <= int64(len(seen)); i++ {
			s = append(s, fmt.Sprintf("%d:%d", i, seen[i]))
		}
		return strings.Join(s, ",")
	}
	rc, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "run", Batch: 4, RetryBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stopRun := start(ctx, func(ctx context.Context) error {
		return rc.Run(ctx, func(_ context.Context, ev eventstore.Event) error {
			mu.Lock()
			defer mu.Unlock()
			seen[ev.GlobalSequence]++
			return nil
		})
	})
	cfg := &natsconsumer.Config{Durable: "tally", Batch: 4}
	pc, err := natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopProjection := start(ctx, func(ctx context.Context) error { return pc.RunProjection(ctx, e.dst.Pool, tally{}) })
	annalstest.WaitFor(t, 10*time.Second, func() bool { return saw() == once(10) && e.tallied(ctx) == once(10) })
	if err := stopProjection(); err != nil {
		t.Fatal(err)
	}

	e.deleteStream(t, ctx)
	if _, err := e.r.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	e.appendEvents(t, ctx, 5)
	for ev, err := range e.store.ReadAll(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.GlobalSequence < 5 {
			continue
		}
		m, err := relay.Message("relay", "annals."+relay.EscapeToken(ev.Type)+"."+relay.EscapeToken(ev.StreamID), ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	pc, err = natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopProjection = start(ctx, func(ctx context.Context) error { return pc.RunProjection(ctx, e.dst.Pool, tally{}) })
	// Stream order: the events published again come before 15.
	annalstest.WaitFor(t, 20*time.Second, func() bool { return saw() == once(15) && e.tallied(ctx) == once(15) })
	for _, stop := range []func() error{stopProjection, stopRun} {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGapsAreReported: a stream limit (MaxMsgs 5 here) removed messages the
// consumer had not read. OnGap gets the run of missing stream sequences
// (2..16), their count and the last position handled before them; its
// error stops RunProjection, which returns it, without moving the
// checkpoint past the gap. The default logs the gap at ERROR level and goes
// on. Before, the missing messages were passed over without a word.
func TestGapsAreReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 1)
	s, err := e.js.Stream(ctx, "ANNALS")
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.MaxMsgs = 5
	if _, err := e.js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	cfg := &natsconsumer.Config{Durable: "totals", Batch: 10, Logger: logs.logger()}
	c, err := natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, totals{}) })
	annalstest.WaitFor(t, 10*time.Second, func() bool { n, _ := e.applied(ctx); return n == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.appendAndRelay(t, ctx, 20) // the stream keeps the newest 5: sequences 17..21

	// An OnGap that refuses.
	errRefused := errors.New("refused")
	var gaps []natsconsumer.Gap
	refusing := *cfg
	refusing.OnGap = func(_ context.Context, g natsconsumer.Gap) error {
		gaps = append(gaps, g)
		return errRefused
	}
	c, err = natsconsumer.New(ctx, e.nc, &refusing)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
	err = c.RunProjection(rctx, e.dst.Pool, totals{})
	rcancel()
	if !errors.Is(err, errRefused) {
		t.Fatalf("RunProjection returned %v, want OnGap's error", err)
	}
	want := natsconsumer.Gap{Consumer: "totals", Stream: "ANNALS", First: 2, Last: 16, Count: 15, After: 1}
	if len(gaps) != 1 || gaps[0] != want {
		t.Fatalf("OnGap got %+v, want once %+v", gaps, want)
	}
	var checkpoint int64
	if err := e.dst.Pool.QueryRow(ctx, `SELECT stream_seq FROM annals.relay_checkpoints WHERE consumer = 'totals'`).Scan(&checkpoint); err != nil {
		t.Fatal(err)
	}
	if n, _ := e.applied(ctx); n != 1 || checkpoint != 1 {
		t.Fatalf("after a refused gap: %d events applied, checkpoint %d; want 1 and 1", n, checkpoint)
	}

	// The default: logged, and passed over.
	c, err = natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop = start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, totals{}) })
	annalstest.WaitFor(t, 10*time.Second, func() bool { n, v := e.applied(ctx); return n == 6 && v == 21 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"level=ERROR", "consumer=totals", "stream=ANNALS", "first=2", "last=16", "count=15", "after_position=1"} {
		if !strings.Contains(logs.String(), s) {
			t.Fatalf("the log does not report the gap (%s):\n%s", s, logs.String())
		}
	}
}

// TestAGapLongerThanABatchIsOneGap: a run of missing messages longer than
// Batch in the middle of the stream (MaxMsgsPerSubject 1 removed all but
// the last of acct-0's ten events: sequences 5..13), met while the next
// consumer reads past a crashed full batch by sequence, goes to OnGap as
// one Gap. Before, it went as one Gap per Batch of sequences read (5..8,
// 9..12, 13..13).
func TestAGapLongerThanABatchIsOneGap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	appendTo := func(stream string, n int) {
		t.Helper()
		for range n {
			if _, err := e.store.Append(ctx, stream, eventstore.Any,
				eventstore.EventData{Type: "deposited", Data: map[string]int{"amount": 1}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 1; i <= 4; i++ {
		appendTo(fmt.Sprintf("acct-%d", i), 1)
	}
	if err := e.r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var gaps []natsconsumer.Gap
	cfg := &natsconsumer.Config{Durable: "tally", Batch: 4, OnGap: func(_ context.Context, g natsconsumer.Gap) error {
		mu.Lock()
		defer mu.Unlock()
		gaps = append(gaps, g)
		return nil
	}}
	if _, err := natsconsumer.New(ctx, e.nc, cfg); err != nil { // makes the durable consumer
		t.Fatal(err)
	}
	e.crash(t, ctx, "tally", 4) // a full batch: the server delivers nothing more until AckWait
	s, err := e.js.Stream(ctx, "ANNALS")
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.MaxMsgsPerSubject = 1
	if _, err := e.js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	appendTo("acct-0", 10) // sequences 5..14, one subject: the stream keeps 14
	appendTo("acct-5", 1)
	appendTo("acct-6", 1)
	if err := e.r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}

	c, err := natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, tally{}) })
	annalstest.WaitFor(t, 20*time.Second, func() bool { return e.tallied(ctx) == "1:1,2:1,3:1,4:1,14:1,15:1,16:1" })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := natsconsumer.Gap{Consumer: "tally", Stream: "ANNALS", First: 5, Last: 13, Count: 9, After: 4}
	mu.Lock()
	defer mu.Unlock()
	if len(gaps) != 1 || gaps[0] != want {
		t.Fatalf("OnGap got %+v, want once %+v", gaps, want)
	}
}

// TestRunAndARefusedGap: Run keeps its place between runs as the durable
// consumer's acknowledgement floor on the server. An OnGap error stops Run
// with it (errors.Is), and the next Run reports the same gap again: the
// messages delivered after the gap were handed back, not acknowledged, so
// the floor stays before it. But once the stream removes those messages
// too (the stream keeps 5 here and 10 more are published), the server
// drops them from the consumer's pending messages after AckWait and moves
// the floor past them: the next Run starts there, and reports only the
// messages removed after it (22..26), not the gap refused before (2..16)
// nor the messages after it (17..21). RunProjection, whose checkpoint the
// server does not move, reports 2..26.
func TestRunAndARefusedGap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 1)
	var mu sync.Mutex
	var handled []int64
	var gaps []natsconsumer.Gap
	run := func(ctx context.Context, onGap error) error {
		cfg := &natsconsumer.Config{Durable: "run", Batch: 10, AckWait: time.Second, OnGap: func(_ context.Context, g natsconsumer.Gap) error {
			mu.Lock()
			defer mu.Unlock()
			gaps = append(gaps, g)
			return onGap
		}}
		c, err := natsconsumer.New(ctx, e.nc, cfg)
		if err != nil {
			return err
		}
		return c.Run(ctx, func(_ context.Context, ev eventstore.Event) error {
			mu.Lock()
			defer mu.Unlock()
			handled = append(handled, ev.GlobalSequence)
			return nil
		})
	}
	result := func() (h []int64, g []natsconsumer.Gap) {
		mu.Lock()
		defer mu.Unlock()
		h, g = handled, gaps
		handled, gaps = nil, nil
		return h, g
	}
	stop := start(ctx, func(ctx context.Context) error { return run(ctx, nil) })
	annalstest.WaitFor(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Its last pull request would take (and hand back when it expires)
	// messages published before then: those the stream removes meanwhile
	// the server drops, moving the floor.
	e.waitForNoPull(t, ctx, "run")
	result()
	s, err := e.js.Stream(ctx, "ANNALS")
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.MaxMsgs = 5
	if _, err := e.js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	e.appendAndRelay(t, ctx, 20) // the stream keeps 17..21

	errRefused := errors.New("refused")
	for i := range 2 {
		rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
		err := run(rctx, errRefused)
		rcancel()
		if !errors.Is(err, errRefused) {
			t.Fatalf("run %d returned %v, want OnGap's error", i+1, err)
		}
		want := natsconsumer.Gap{Consumer: "run", Stream: "ANNALS", First: 2, Last: 16, Count: 15}
		if h, g := result(); len(h) != 0 || len(g) != 1 || g[0] != want {
			t.Fatalf("run %d handled %v, OnGap got %+v; want nothing handled, once %+v", i+1, h, g, want)
		}
	}

	e.appendAndRelay(t, ctx, 10) // the stream keeps 27..31: 17..21, delivered and handed back, are gone too
	cons, err := e.js.Consumer(ctx, "ANNALS", "run")
	if err != nil {
		t.Fatal(err)
	}
	var floor uint64
	annalstest.WaitFor(t, 15*time.Second, func() bool {
		info, err := cons.Info(ctx)
		if err == nil {
			floor = info.AckFloor.Stream
		}
		return floor > 16 // 21 with nats-server 2.15
	})
	stop = start(ctx, func(ctx context.Context) error { return run(ctx, nil) })
	annalstest.WaitFor(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) == 5 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var want []natsconsumer.Gap
	if floor < 26 {
		want = append(want, natsconsumer.Gap{Consumer: "run", Stream: "ANNALS", First: floor + 1, Last: 26, Count: 26 - floor})
	}
	if h, g := result(); fmt.Sprint(h) != "[27 28 29 30 31]" || fmt.Sprint(g) != fmt.Sprint(want) {
		t.Fatalf("after the floor moved to %d: handled %v, OnGap got %+v; want 27..31, %+v", floor, h, g, want)
	}
}

// TestRunProjectionUpgradesItsCheckpointTable: a checkpoint table made
// before it kept the event position and the stream's creation time gets
// the two columns; its row (NULL there: taken to be of the stream as it is
// now) goes on from its stream sequence, and the next save fills them in.
func TestRunProjectionUpgradesItsCheckpointTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := e.dst.Pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS annals;
		CREATE TABLE annals.relay_checkpoints (
		    consumer   text        NOT NULL PRIMARY KEY,
		    stream_seq bigint      NOT NULL,
		    updated_at timestamptz NOT NULL DEFAULT clock_timestamp());
		INSERT INTO annals.relay_checkpoints (consumer, stream_seq) VALUES ('tally', 5)`); err != nil {
		t.Fatal(err)
	}
	e.appendAndRelay(t, ctx, 10)
	c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "tally", Batch: 4})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, tally{}) })
	annalstest.WaitFor(t, 10*time.Second, func() bool { return e.tallied(ctx) == "6:1,7:1,8:1,9:1,10:1" })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	s, err := e.js.Stream(ctx, "ANNALS")
	if err != nil {
		t.Fatal(err)
	}
	var seq, pos int64
	var created time.Time
	if err := e.dst.Pool.QueryRow(ctx, `SELECT stream_seq, position, stream_created FROM annals.relay_checkpoints WHERE consumer = 'tally'`).
		Scan(&seq, &pos, &created); err != nil {
		t.Fatal(err)
	}
	if want := s.CachedInfo().Created.Truncate(time.Microsecond); seq != 10 || pos != 10 || !created.Equal(want) {
		t.Fatalf("checkpoint: sequence %d, position %d, stream made at %v; want 10, 10, %v", seq, pos, created, want)
	}
}
