package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"regexp"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/natsserver"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/relay"
	"github.com/annals-dev/annals/walsource"
)

const schema = "annals_bench_relay"

var (
	rate     = flag.Int("rate", 500, "events/s for the latency runs")
	duration = flag.Duration("duration", 3*time.Second, "length of each latency and throughput run")
	backlog  = flag.Int("backlog", 20000, "events in the relay throughput backlog")
	writers  = flag.Int("writers", 8, "writers in the append throughput runs")
	batch    = flag.Int("batch", 500, "relay batch size (and the raw publisher's ack window)")
	cpuprof  = flag.String("cpuprofile", "", "write a CPU profile of the relay runs to this file")
	only     = flag.String("only", "", "run only this part: latency, append, relay, jslatency")
)

func main() {
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := run(ctx); err != nil {
		log.Fatalf("bench relay: %v", err)
	}
}

type bench struct {
	saved []string // append_batch and append_one as migrated (notifyFuncs)
	pool  *pgxpool.Pool
	store *eventstore.Store
	wake  *walsource.Wake
	nc    *nats.Conn
	js    jetstream.JetStream
}

func run(ctx context.Context) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("set DATABASE_URL")
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	pcfg.MaxConns = int32(*writers + 8)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	b := &bench{pool: pool}
	if err := b.fresh(ctx); err != nil {
		return err
	}
	defer b.dropSlots(context.WithoutCancel(ctx))
	dir, err := os.MkdirTemp("", "annals-bench-relay-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ns, err := natsserver.Start(dir, 0)
	if err != nil {
		return err
	}
	defer ns.Stop()
	if b.nc, err = nats.Connect(ns.ClientURL()); err != nil {
		return err
	}
	defer b.nc.Close()
	if b.js, err = jetstream.New(b.nc); err != nil {
		return err
	}
	var pgVersion, fsync string
	_ = pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync')`).Scan(&pgVersion, &fsync)
	fmt.Printf("PostgreSQL %s (fsync %s), NATS server embedded (JetStream file storage), rate %d/s, runs of %v\n\n", pgVersion, fsync, *rate, *duration)

	part := func(name string) bool { return *only == "" || *only == name }
	// 1. Wake: latency.
	if part("latency") {
		fmt.Println("append -> handler latency (live observer, single-event appends, 4 writers)")
		for _, wal := range []bool{false, true, false, true} {
			lat, sent, err := b.handlerLatency(ctx, wal)
			if err != nil {
				return err
			}
			fmt.Printf("  %-6s p50 %7s  p99 %7s  max %7s  (%d events at %.0f/s)\n", wakeName(wal), lat.p(50), lat.p(99), lat.p(100), len(lat), sent)
		}
	}
	// 2. Wake: append throughput, with and without NOTIFY in the append.
	if part("append") {
		fmt.Printf("\nappend throughput (%d writers, single-event appends, a live observer following)\n", *writers)
		for _, c := range []struct {
			wal, notify bool
		}{{false, true}, {true, true}, {true, false}, {false, true}, {true, true}, {true, false}} {
			if err := b.setNotify(ctx, c.notify); err != nil {
				return err
			}
			n, err := b.appendThroughput(ctx, c.wal)
			if err != nil {
				return err
			}
			note := "append NOTIFYs"
			if !c.notify {
				note = "append without pg_notify"
			}
			fmt.Printf("  %-6s %-26s %8.0f events/s\n", wakeName(c.wal), note, n)
		}
		if err := b.setNotify(ctx, true); err != nil {
			return err
		}

	}
	// 3. Relay throughput against a raw publisher.
	if part("relay") {
		fmt.Printf("\nrelay throughput into JetStream, acknowledged (%d-event backlog, batches of %d)\n", *backlog, *batch)
		if err := b.fillBacklog(ctx, *backlog); err != nil {
			return err
		}
		for i := range 2 {
			raw, err := b.rawPublish(ctx, fmt.Sprintf("RAW%d", i), false)
			if err != nil {
				return err
			}
			chained, err := b.rawPublish(ctx, fmt.Sprintf("CHAIN%d", i), true)
			if err != nil {
				return err
			}
			rel, err := b.relayCatchUp(ctx, fmt.Sprintf("REL%d", i))
			if err != nil {
				return err
			}
			fmt.Printf("  run %d: relay %8.0f events/s   raw publisher %8.0f events/s (with the relay's expected-last-msg-id chain %8.0f)   relay/raw %.2f\n",
				i+1, rel, raw, chained, rel/raw)
		}

	}
	// 4. Append -> JetStream consumer latency.
	if part("jslatency") {
		fmt.Println("\nappend -> JetStream consumer latency (live relay, single-event appends, 4 writers)")
		for i, wal := range []bool{false, true, false, true} {
			lat, sent, err := b.jetStreamLatency(ctx, wal, fmt.Sprintf("LAT%d", i))
			if err != nil {
				return err
			}
			fmt.Printf("  %-6s p50 %7s  p99 %7s  max %7s  (%d events at %.0f/s)\n", wakeName(wal), lat.p(50), lat.p(99), lat.p(100), len(lat), sent)
		}
	}
	return nil
}

func wakeName(wal bool) string {
	if wal {
		return "WAL"
	}
	return "NOTIFY"
}

func (b *bench) fresh(ctx context.Context) error {
	b.dropSlots(ctx)
	if _, err := b.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return err
	}
	if _, err := b.pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{walsource.PublicationName(schema)}.Sanitize()); err != nil {
		return err
	}
	if _, err := migrations.Up(ctx, b.pool, &migrations.Config{Schema: schema}); err != nil {
		return err
	}
	var err error
	if b.store, err = eventstore.New(b.pool, &eventstore.Config{Schema: schema}); err != nil {
		return err
	}
	b.wake, err = walsource.NewWake(ctx, b.pool, &walsource.WakeConfig{Schema: schema})
	return err
}

func (b *bench) dropSlots(ctx context.Context) {
	slots, _ := walsource.Slots(ctx, b.pool)
	for _, s := range slots {
		if len(s.Slot) > 0 {
			_ = walsource.DropSlot(ctx, b.pool, s.Slot)
		}
	}
}

// setNotify installs the stock append_batch and append_one (on) or copies of
// them without their pg_notify (off), which is what appends could drop when
// every consumer follows the WAL. (Store.Append sends a lone single-event
// append through append_one, groups through append_batch.)
var notifyStmt = regexp.MustCompile(`(?m)^\s*v_void := pg_notify\([^;]*\);\s*$`)

var notifyFuncs = []string{
	"append_batch(text[], bigint[], int[], int[], uuid[], text[], text[], text[], boolean)",
	"append_one(text, bigint, uuid, text, text, text, boolean)",
}

func (b *bench) setNotify(ctx context.Context, on bool) error {
	if b.saved == nil {
		for _, f := range notifyFuncs {
			var def string
			if err := b.pool.QueryRow(ctx, "SELECT pg_get_functiondef($1::regprocedure)", pgx.Identifier{schema}.Sanitize()+"."+f).Scan(&def); err != nil {
				return errors.Wrapf(err, "read %s", f)
			}
			b.saved = append(b.saved, def)
		}
	}
	for i, saved := range b.saved {
		def := saved
		if !on {
			def = notifyStmt.ReplaceAllString(def, "")
			if def == saved {
				return errors.Newf("no pg_notify found in %s", notifyFuncs[i])
			}
		}
		if _, err := b.pool.Exec(ctx, def); err != nil {
			return errors.Wrapf(err, "replace %s", notifyFuncs[i])
		}
	}
	return nil
}

// latencies are sorted durations.
type latencies []time.Duration

func (l latencies) p(q int) string {
	if len(l) == 0 {
		return "-"
	}
	i := min(len(l)-1, len(l)*q/100)
	return l[i].Round(10 * time.Microsecond).String()
}

// stamp is the payload of a timed event: when its append started.
type stamp struct {
	T int64 `json:"t"`
}

// paced appends single events carrying their start time from 4 writers at
// the given rate for d, and returns the achieved rate.
func (b *bench) paced(ctx context.Context, stream string, d time.Duration) (float64, error) {
	const w = 4
	ticks := make(chan struct{}, *rate)
	var sent atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, w)
	for i := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range ticks {
				_, err := b.store.Append(ctx, fmt.Sprintf("%s-%d", stream, i), eventstore.Any,
					eventstore.EventData{Type: "bench.timed", Data: stamp{T: time.Now().UnixNano()}})
				if err != nil {
					errs <- err
					return
				}
				sent.Add(1)
			}
		}()
	}
	start := time.Now()
	t := time.NewTicker(time.Second / time.Duration(*rate))
	for time.Since(start) < d {
		<-t.C
		select {
		case ticks <- struct{}{}:
		default: // the writers are behind: the tick is dropped
		}
	}
	t.Stop()
	close(ticks)
	wg.Wait()
	close(errs)
	for err := range errs {
		return 0, err
	}
	return float64(sent.Load()) / time.Since(start).Seconds(), nil
}

// latencyObserver records now - the event's stamp for each timed event.
type latencyObserver struct {
	name string
	mu   sync.Mutex
	lat  latencies
}

func (o *latencyObserver) Name() string { return o.name }

func (o *latencyObserver) Handle(_ context.Context, e eventstore.Event) error {
	var s stamp
	if json.Unmarshal(e.Data, &s) != nil || s.T == 0 {
		return nil
	}
	d := time.Duration(time.Now().UnixNano() - s.T)
	o.mu.Lock()
	o.lat = append(o.lat, d)
	o.mu.Unlock()
	return nil
}

func (o *latencyObserver) take() latencies {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := slices.Clone(o.lat)
	slices.Sort(l)
	return l
}

// runner starts a live runner with o, woken by NOTIFY or the WAL, from the
// head on (its poll interval is a minute: the wake-up is what is measured).
func (b *bench) runner(ctx context.Context, handler any, wal bool) (stop func(), err error) {
	cfg := &projection.Config{Schema: schema, PollInterval: time.Minute}
	if wal {
		cfg.Wake = b.wake.For
	}
	r, err := projection.NewRunner(b.pool, cfg)
	if err != nil {
		return nil, err
	}
	if err := r.Register(handler, &projection.Options{CheckpointInterval: 100 * time.Millisecond}); err != nil {
		return nil, err
	}
	// Start from the head: the events of earlier runs are not measured.
	if err := b.fromHead(ctx, handler.(interface{ Name() string }).Name()); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	return func() { cancel(); <-done }, nil
}

var runs atomic.Int64

// fromHead sets a subscriber's checkpoint to the head of the log.
func (b *bench) fromHead(ctx context.Context, name string) error {
	head, err := b.store.Head(ctx)
	if err != nil {
		return err
	}
	cps, err := checkpoint.New(schema)
	if err != nil {
		return err
	}
	_, err = cps.Set(ctx, b.pool, name, 0, head)
	return err
}

func (b *bench) handlerLatency(ctx context.Context, wal bool) (latencies, float64, error) {
	o := &latencyObserver{name: fmt.Sprintf("lat-%d", runs.Add(1))}
	stop, err := b.runner(ctx, o, wal)
	if err != nil {
		return nil, 0, err
	}
	// Let the leadership start (and the WAL stream, when used) before timing.
	if err := b.warmUp(ctx, func() int { return len(o.take()) }); err != nil {
		stop()
		return nil, 0, err
	}
	o.mu.Lock()
	o.lat = nil
	o.mu.Unlock()
	sent, err := b.paced(ctx, "lat", *duration)
	if err != nil {
		stop()
		return nil, 0, err
	}
	want := int(sent * duration.Seconds() * 0.99)
	deadline := time.Now().Add(10 * time.Second)
	for len(o.take()) < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	return o.take(), sent, nil
}

// warmUp appends one timed event at a time until count reports one seen.
func (b *bench) warmUp(ctx context.Context, count func() int) error {
	deadline := time.Now().Add(20 * time.Second)
	for count() == 0 {
		if time.Now().After(deadline) {
			return errors.New("the consumer did not start within 20s")
		}
		if _, err := b.store.Append(ctx, "warmup", eventstore.Any, eventstore.EventData{Type: "bench.timed", Data: stamp{T: time.Now().UnixNano()}}); err != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// appendThroughput runs writers appending single events as fast as they can
// for the run's duration, with a live observer following, and returns
// events/s.
func (b *bench) appendThroughput(ctx context.Context, wal bool) (float64, error) {
	o := &latencyObserver{name: fmt.Sprintf("tp-%d", runs.Add(1))}
	stop, err := b.runner(ctx, o, wal)
	if err != nil {
		return 0, err
	}
	defer stop()
	if err := b.warmUp(ctx, func() int { return len(o.take()) }); err != nil {
		return 0, err
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, *writers)
	start := time.Now()
	for i := range *writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < *duration {
				if _, err := b.store.Append(ctx, fmt.Sprintf("tp-%d", i), eventstore.Any,
					eventstore.EventData{Type: "bench.tp", Data: map[string]int{"i": i}}); err != nil {
					errs <- err
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return 0, err
	}
	return float64(n.Load()) / time.Since(start).Seconds(), nil
}

// fillBacklog appends n events, 100 per append.
func (b *bench) fillBacklog(ctx context.Context, n int) error {
	for i := 0; i < n; i += 100 {
		evs := make([]eventstore.EventData, 0, 100)
		for j := range min(100, n-i) {
			evs = append(evs, eventstore.EventData{Type: "bench.backlog", Data: map[string]int{"i": i + j},
				Metadata: eventstore.Metadata{CorrelationID: "bench"}})
		}
		if _, err := b.store.Append(ctx, fmt.Sprintf("backlog-%d", i%50), eventstore.Any, evs...); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) backlogEvents(ctx context.Context) ([]eventstore.Event, error) {
	var out []eventstore.Event
	for e, err := range b.store.ReadAll(ctx, 0) {
		if err != nil {
			return nil, err
		}
		if e.Type == "bench.backlog" {
			out = append(out, e)
		}
	}
	return out, nil
}

// rawPublish publishes the backlog's messages (as the relay builds them) to
// a fresh stream like the relay's, pipelined in windows of 500 and waiting
// for every ack, and returns events/s (messages built beforehand).
func (b *bench) rawPublish(ctx context.Context, stream string, chained bool) (float64, error) {
	evs, err := b.backlogEvents(ctx)
	if err != nil {
		return 0, err
	}
	r, err := relay.New(b.pool, b.nc, &relay.Config{Schema: schema, Stream: stream, Prefix: stream})
	if err != nil {
		return 0, err
	}
	if _, err := r.EnsureStream(ctx); err != nil {
		return 0, err
	}
	msgs := make([]*nats.Msg, len(evs))
	for i, e := range evs {
		if msgs[i], err = relay.Message("raw", stream+".bench%2Ebacklog."+relay.EscapeToken(e.StreamID), e); err != nil {
			return 0, err
		}
	}
	js, err := jetstream.New(b.nc, jetstream.WithPublishAsyncMaxPending(2*(*batch)))
	if err != nil {
		return 0, err
	}
	start := time.Now()
	prev := ""
	for i := 0; i < len(msgs); i += *batch {
		var fs []jetstream.PubAckFuture
		for _, m := range msgs[i:min(i+*batch, len(msgs))] {
			opts := []jetstream.PublishOpt{jetstream.WithMsgID(m.Header.Get(relay.HeaderEventID))}
			if chained && prev != "" {
				opts = append(opts, jetstream.WithExpectLastMsgID(prev))
			}
			prev = m.Header.Get(relay.HeaderEventID)
			f, err := js.PublishMsgAsync(m, opts...)
			if err != nil {
				return 0, err
			}
			fs = append(fs, f)
		}
		for _, f := range fs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return 0, err
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
	}
	return float64(len(msgs)) / time.Since(start).Seconds(), nil
}

// relayCatchUp relays the backlog with relay.CatchUp (reads, publishes,
// acks, checkpoint commits) into a fresh stream and returns events/s.
func (b *bench) relayCatchUp(ctx context.Context, stream string) (float64, error) {
	r, err := relay.New(b.pool, b.nc, &relay.Config{Schema: schema, Name: "relay-" + stream, Stream: stream, Prefix: stream, Types: []string{"bench.backlog"}, BatchSize: *batch})
	if err != nil {
		return 0, err
	}
	if _, err := r.EnsureStream(ctx); err != nil {
		return 0, err
	}
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof + "." + stream)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return 0, err
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	if err := r.CatchUp(ctx); err != nil {
		return 0, err
	}
	el := time.Since(start)
	s, err := b.js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	return float64(s.CachedInfo().State.Msgs) / el.Seconds(), nil
}

// jetStreamLatency runs a live relay (from the head) and an ordered consumer
// on its stream, and measures append -> consumer for paced appends.
func (b *bench) jetStreamLatency(ctx context.Context, wal bool, stream string) (latencies, float64, error) {
	cfg := &relay.Config{Schema: schema, Name: "relay-" + stream, Stream: stream, Prefix: stream,
		Types: []string{"bench.timed"}, PollInterval: time.Minute}
	if wal {
		cfg.WAL = b.wake
	}
	r, err := relay.New(b.pool, b.nc, cfg)
	if err != nil {
		return nil, 0, err
	}
	if _, err := r.EnsureStream(ctx); err != nil {
		return nil, 0, err
	}
	if err := b.fromHead(ctx, cfg.Name); err != nil {
		return nil, 0, err
	}
	cons, err := b.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return nil, 0, err
	}
	o := &latencyObserver{}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		e, err := relay.Decode(m.Headers(), m.Data())
		if err == nil {
			_ = o.Handle(ctx, e)
		}
	})
	if err != nil {
		return nil, 0, err
	}
	defer cc.Stop()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	defer func() { cancel(); <-done }()
	if err := b.warmUp(ctx, func() int { return len(o.take()) }); err != nil {
		return nil, 0, err
	}
	o.mu.Lock()
	o.lat = nil
	o.mu.Unlock()
	sent, err := b.paced(ctx, "js", *duration)
	if err != nil {
		return nil, 0, err
	}
	want := int(sent * duration.Seconds() * 0.99)
	deadline := time.Now().Add(10 * time.Second)
	for len(o.take()) < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return o.take(), sent, nil
}
