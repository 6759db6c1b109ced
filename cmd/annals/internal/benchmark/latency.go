package benchmark

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/poolconn"
	"github.com/annals-dev/annals/projection"
)

// LatencyConfig configures RunLatency. A nil *LatencyConfig means defaults.
type LatencyConfig struct {
	// Schema is the schema the benchmark drops, recreates and leaves behind.
	// Defaults to "annals_bench_latency".
	Schema string
	// Rates lists the target append rates, events per second. Defaults to
	// 100, 1000.
	Rates []int
	// Duration is how long each rate is sustained, per contender. Defaults
	// to 3s.
	Duration time.Duration
	// Writers is the number of concurrent writers sharing the load (one
	// single-event append per event, handed to a free writer when due).
	// Defaults to 4.
	Writers int
	// PollInterval is the runner's poll interval: long enough that the
	// figures measure the NOTIFY path. Defaults to 5s.
	PollInterval time.Duration
	// Progress receives a line as each measurement starts. Defaults to none.
	Progress io.Writer
}

// LatencyResult is one target rate.
type LatencyResult struct {
	Rate   int `json:"target_events_per_sec"`
	Events int `json:"events"`
	// The rates the writers achieved.
	AnnalsRate float64 `json:"annals_sent_events_per_sec"`
	RawRate    float64 `json:"raw_sent_events_per_sec"`
	// Time from the event's hand-out (at the generator's first tick at or
	// after its due time; just before its append when a writer is free,
	// and waiting for a free writer counts) to the start of the handler
	// (annals) or to the decoding of the row by the raw listener.
	Annals Latencies `json:"annals"`
	Raw    Latencies `json:"raw"`
	// The appends' own round trips (from just before the append to its
	// return): the part of the end-to-end figure the writer sees.
	AnnalsAppend Latencies `json:"annals_append"`
	RawAppend    Latencies `json:"raw_append"`
	// Ratios of annals to raw.
	P50VsRaw float64 `json:"p50_vs_raw"`
	P99VsRaw float64 `json:"p99_vs_raw"`
}

// LatencyReport is the outcome of RunLatency.
type LatencyReport struct {
	Writers        int             `json:"writers"`
	PollInterval   string          `json:"poll_interval"`
	DurationPerRun string          `json:"duration_per_run"`
	Results        []LatencyResult `json:"results"`
}

func (c *LatencyConfig) withDefaults() LatencyConfig {
	var out LatencyConfig
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = "annals_bench_latency"
	}
	if len(out.Rates) == 0 {
		out.Rates = []int{100, 1000}
	}
	if out.Duration <= 0 {
		out.Duration = 3 * time.Second
	}
	if out.Writers <= 0 {
		out.Writers = 4
	}
	if out.PollInterval <= 0 {
		out.PollInterval = 5 * time.Second
	}
	if out.Progress == nil {
		out.Progress = io.Discard
	}
	return out
}

// RunLatency measures the time from an append to the start of a live
// observer's handler, at each target rate, beside a raw LISTEN consumer of
// a raw INSERT + NOTIFY. The pool must allow Writers + 2 connections.
func RunLatency(ctx context.Context, pool *pgxpool.Pool, cfg *LatencyConfig) (*LatencyReport, error) {
	c := cfg.withDefaults()
	for _, r := range c.Rates {
		if r < 1 || r > 100_000 {
			return nil, errors.Newf("benchmark: rate %d events/s: want 1..100000", r)
		}
	}
	if c.Writers+2 > int(pool.Config().MaxConns) {
		return nil, errors.Newf("benchmark: %d writers need %d pool connections", c.Writers, c.Writers+2)
	}
	q, err := freshSchema(ctx, pool, c.Schema)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, q["Setup"]); err != nil {
		return nil, errors.Wrap(err, "benchmark: create the baseline table")
	}
	store, err := eventstore.New(pool, &eventstore.Config{Schema: c.Schema})
	if err != nil {
		return nil, err
	}

	// The consumers run for the whole benchmark; each measurement gives them
	// a fresh probe.
	var annalsProbe, rawProbe atomic.Pointer[probe]
	annalsProbe.Store(newProbe())
	rawProbe.Store(newProbe())
	runner, err := projection.NewRunner(pool, &projection.Config{Schema: c.Schema, PollInterval: c.PollInterval})
	if err != nil {
		return nil, err
	}
	if err := runner.Register(&latencyObserver{name: "bench-latency", probe: &annalsProbe}, &projection.Options{BatchSize: 500}); err != nil {
		return nil, err
	}
	consumers, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	consumerErr := make(chan error, 2)
	defer func() { stop(); wg.Wait() }()
	wg.Add(2)
	go func() { defer wg.Done(); consumerErr <- runner.Run(consumers) }()
	listening := make(chan struct{})
	go func() { defer wg.Done(); consumerErr <- rawListen(consumers, pool, q, &rawProbe, listening) }()
	select {
	case <-listening:
	case err := <-consumerErr:
		return nil, errors.Wrap(err, "benchmark: start the raw listener")
	case <-ctx.Done():
		return nil, ctx.Err()
	}

	k1, k2 := lockkey.Pair(c.Schema + ":bench-baseline")
	versions := make([]int64, c.Writers) // each raw writer's stream version
	rawSend := func(ctx context.Context, w int, id uuid.UUID) error {
		payload, err := payloadFor([]uuid.UUID{id})
		if err != nil {
			return err
		}
		batch := &pgx.Batch{}
		batch.Queue(q["Lock"], k1, k2)
		batch.Queue(q["RawInsert"], fmt.Sprintf("raw-w%d", w), versions[w], payload)
		batch.Queue(q["RawNotify"], "")
		// One implicit transaction, one round trip, like Store.Append.
		if err := pool.SendBatch(ctx, batch).Close(); err != nil {
			return err
		}
		versions[w]++
		return nil
	}
	annalsSend := func(ctx context.Context, w int, id uuid.UUID) error {
		_, err := store.Append(ctx, fmt.Sprintf("annals-w%d", w), eventstore.Any,
			eventstore.EventData{ID: id, Type: "bench.deposited", Data: eventData(w)})
		return err
	}

	// Warm up: both consumers are live once they have seen one event each.
	fmt.Fprintf(c.Progress, "latency: waiting for the runner to lead and listen ...\n")
	for _, ct := range []struct {
		probe *atomic.Pointer[probe]
		send  func(context.Context, int, uuid.UUID) error
	}{{&annalsProbe, annalsSend}, {&rawProbe, rawSend}} {
		if _, _, _, err := measureLatency(ctx, ct.probe, 1, 1, 1, 30*time.Second+2*c.PollInterval, ct.send); err != nil {
			return nil, errors.Wrap(err, "benchmark: latency warm-up")
		}
	}

	// Settle what earlier work left behind: a large write before this
	// benchmark (the catch-up's million events, in `annals bench`) leaves
	// a checkpoint spreading its writes over minutes, whose final fsyncs
	// stalled one contender's window by 50-200 ms (docs/benchmarks.md).
	// CHECKPOINT finishes it now; it needs superuser or pg_checkpoint.
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		fmt.Fprintf(c.Progress, "latency: CHECKPOINT refused (%v); a checkpoint under way may fall into a measurement\n", err)
	}
	rep := &LatencyReport{Writers: c.Writers, PollInterval: c.PollInterval.String(), DurationPerRun: c.Duration.String()}
	for i, rate := range c.Rates {
		n := max(int(float64(rate)*c.Duration.Seconds()), 2)
		r := LatencyResult{Rate: rate, Events: n}
		grace := 10*time.Second + 2*c.PollInterval
		fmt.Fprintf(c.Progress, "latency %d/%d: %d events at %d/s ...\n", i+1, len(c.Rates), n, rate)
		annals := func() (err error) {
			r.AnnalsRate, r.Annals, r.AnnalsAppend, err = measureLatency(ctx, &annalsProbe, rate, n, c.Writers, grace, annalsSend)
			return errors.Wrap(err, "benchmark: latency of annals")
		}
		raw := func() (err error) {
			r.RawRate, r.Raw, r.RawAppend, err = measureLatency(ctx, &rawProbe, rate, n, c.Writers, 10*time.Second, rawSend)
			return errors.Wrap(err, "benchmark: latency of the raw baseline")
		}
		// The contenders take turns going first, so that neither always
		// meets what the previous rate (or benchmark) left behind.
		first, second := annals, raw
		if i%2 == 1 {
			first, second = raw, annals
		}
		if err := first(); err != nil {
			return nil, err
		}
		if err := second(); err != nil {
			return nil, err
		}
		r.P50VsRaw = ratio(r.Annals.P50, r.Raw.P50)
		r.P99VsRaw = ratio(r.Annals.P99, r.Raw.P99)
		rep.Results = append(rep.Results, r)
	}
	return rep, nil
}

// measureLatency appends n events at rate per second, shared by writers
// (each event, when it is due, goes to the next free writer), and waits up
// to grace after the last one for the consumer to have seen them all. It
// returns the rate the writers achieved, the latencies (from the moment
// each event was handed out, when due, so that time spent waiting for a free
// writer counts) and the appends' own durations (from the call).
func measureLatency(ctx context.Context, pp *atomic.Pointer[probe], rate, n, writers int, grace time.Duration,
	send func(ctx context.Context, w int, id uuid.UUID) error) (float64, Latencies, Latencies, error) {
	p := newProbe()
	pp.Store(p)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type job struct {
		id        uuid.UUID
		handedOut time.Time
	}
	jobs := make(chan job, n)
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				p.sent(j.id, j.handedOut)
				if err := send(ctx, w, j.id); err != nil {
					errs <- errors.Wrapf(err, "writer %d", w)
					cancel()
					return
				}
				p.returned(j.id)
			}
		}()
	}
	// Open loop: at each tick, hand out every event due by now (the i-th
	// is due at start + i/rate), so that a tick the scheduler delivers
	// late (at high rates on a busy machine) does not lower the offered
	// rate.
	interval := time.Second / time.Duration(rate)
	ticker := time.NewTicker(max(interval, 100*time.Microsecond))
	start := time.Now()
	for i := 0; i < n && ctx.Err() == nil; {
		// Latency counts from the hand-out, not from the planned time: the
		// ticker's own lateness (up to a tick) is the generator's, not the
		// system's; waiting in the channel for a free writer counts.
		now := time.Now()
		due := min(n, int(now.Sub(start)/interval)+1)
		for ; i < due; i++ {
			id, _ := uuid.NewV7()
			jobs <- job{id, now}
		}
		if i < n {
			select {
			case <-ticker.C:
			case <-ctx.Done():
			}
		}
	}
	ticker.Stop()
	close(jobs)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, Latencies{}, Latencies{}, err
	}
	if err := ctx.Err(); err != nil {
		return 0, Latencies{}, Latencies{}, err
	}
	deadline := time.Now().Add(grace)
	for missing := p.missing(); missing > 0; missing = p.missing() {
		if time.Now().After(deadline) {
			return 0, Latencies{}, Latencies{}, errors.Newf("%d of %d events not seen by the consumer within %s", missing, n, grace)
		}
		select {
		case <-ctx.Done():
			return 0, Latencies{}, Latencies{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	achieved, ds, appends := p.results()
	return achieved, summarize(ds), summarize(appends), nil
}

// probe pairs the time each event was handed out with the times its append
// was called, returned and it was seen.
type probe struct {
	mu         sync.Mutex
	handedAt   map[uuid.UUID]time.Time
	calledAt   map[uuid.UUID]time.Time
	returnedAt map[uuid.UUID]time.Time
	seenAt     map[uuid.UUID]time.Time
}

func newProbe() *probe {
	return &probe{handedAt: map[uuid.UUID]time.Time{}, calledAt: map[uuid.UUID]time.Time{},
		returnedAt: map[uuid.UUID]time.Time{}, seenAt: map[uuid.UUID]time.Time{}}
}

// returned records that the append of id has returned.
func (p *probe) returned(id uuid.UUID) {
	now := time.Now()
	p.mu.Lock()
	p.returnedAt[id] = now
	p.mu.Unlock()
}

// sent records that id, handed out at handedOut, is about to be appended.
func (p *probe) sent(id uuid.UUID, handedOut time.Time) {
	now := time.Now()
	p.mu.Lock()
	p.handedAt[id] = handedOut
	p.calledAt[id] = now
	p.mu.Unlock()
}

// saw records that the consumer saw id at.
func (p *probe) saw(id uuid.UUID, at time.Time) {
	p.mu.Lock()
	if _, dup := p.seenAt[id]; !dup {
		p.seenAt[id] = at
	}
	p.mu.Unlock()
}

// missing returns how many sent events have not been seen.
func (p *probe) missing() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for id := range p.handedAt {
		if _, ok := p.seenAt[id]; !ok {
			n++
		}
	}
	return n
}

// results returns the achieved send rate (of the calls), every event's
// latency (from its hand-out) and every append's duration.
func (p *probe) results() (float64, []time.Duration, []time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ds := make([]time.Duration, 0, len(p.handedAt))
	appends := make([]time.Duration, 0, len(p.handedAt))
	var first, last time.Time
	for id, t := range p.calledAt {
		ds = append(ds, p.seenAt[id].Sub(p.handedAt[id]))
		appends = append(appends, p.returnedAt[id].Sub(t))
		if first.IsZero() || t.Before(first) {
			first = t
		}
		if t.After(last) {
			last = t
		}
	}
	rate := 0.0
	if span := last.Sub(first); span > 0 {
		rate = float64(len(p.calledAt)-1) / span.Seconds()
	}
	return rate, ds, appends
}

// latencyObserver records when Handle starts for each event.
type latencyObserver struct {
	name  string
	probe *atomic.Pointer[probe]
}

func (o *latencyObserver) Name() string { return o.name }

func (o *latencyObserver) Handle(_ context.Context, e eventstore.Event) error {
	now := time.Now()
	o.probe.Load().saw(e.ID, now)
	return nil
}

// rawListen is the raw consumer: LISTEN on a connection of its own and, on
// each notification, read the rows after the last one seen.
func rawListen(ctx context.Context, pool *pgxpool.Pool, q map[string]string, pp *atomic.Pointer[probe], listening chan<- struct{}) error {
	conn, err := poolconn.Connect(ctx, pool)
	if err != nil {
		return errors.Wrap(err, "connect the raw listener")
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, q["RawListen"]); err != nil {
		return errors.Wrap(err, "raw LISTEN")
	}
	close(listening)
	const limit = 500
	var after int64
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return errors.Wrap(err, "raw listener")
		}
		for {
			rows, err := conn.Query(ctx, q["ReadRaw"], after, limit)
			if err != nil {
				return errors.Wrap(err, "raw listener: read")
			}
			events, err := eventstore.ScanEvents(rows, limit)
			if err != nil {
				return errors.Wrap(err, "raw listener: read")
			}
			p := pp.Load()
			for _, e := range events {
				p.saw(e.ID, time.Now())
				after = e.GlobalSequence
			}
			if len(events) < limit {
				break
			}
		}
	}
}

// payloadFor returns the JSON array of one event per ID, in the shape
// append_events takes. A json.RawMessage, not a []byte: pgx sends a []byte
// as bytea text in QueryExecModeExec and QueryExecModeSimpleProtocol, which
// a json or jsonb parameter refuses (a DATABASE_URL may set either mode).
func payloadFor(ids []uuid.UUID) (json.RawMessage, error) {
	type item struct {
		EventID uuid.UUID      `json:"event_id"`
		Type    string         `json:"type"`
		Data    map[string]any `json:"data"`
	}
	items := make([]item, len(ids))
	for i, id := range ids {
		items[i] = item{id, "bench.deposited", eventData(i)}
	}
	b, err := json.Marshal(items)
	return b, errors.Wrap(err, "benchmark: encode payload")
}

// WriteLatencyTable prints the report as an aligned table.
func WriteLatencyTable(w io.Writer, s Settings, rep *LatencyReport) error {
	fmt.Fprintf(w, "end-to-end latency, ms: the event handed out when due (its append called then when a writer is free) → start of the handler, an upper bound that includes the append's round trip (%s; %d writers, poll interval %s, %s per rate)\n",
		s, rep.Writers, rep.PollInterval, rep.DurationPerRun)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target/s\tannals sent/s\tannals p50\tp99\tmax\tappend p50\traw sent/s\traw p50\tp99\tmax\tappend p50\tp50 annals/raw\tp99 annals/raw\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%d\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", r.Rate,
			r.AnnalsRate, r.Annals.P50, r.Annals.P99, r.Annals.Max, r.AnnalsAppend.P50,
			r.RawRate, r.Raw.P50, r.Raw.P99, r.Raw.Max, r.RawAppend.P50, r.P50VsRaw, r.P99VsRaw)
	}
	return tw.Flush()
}
