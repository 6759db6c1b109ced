package benchmark

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/procstat"
	"github.com/annals-dev/annals/internal/telemetry"
	"github.com/annals-dev/annals/projection"
)

// CatchupConfig configures RunCatchup. A nil *CatchupConfig means defaults.
type CatchupConfig struct {
	// Schema is the schema the benchmark drops, recreates, fills and leaves
	// behind for inspection. Defaults to "annals_bench_catchup".
	Schema string
	// Events is the number of events in the log that every contender reads
	// from the start. Defaults to 1,000,000.
	Events int
	// BatchSize is the number of events every contender reads at a time.
	// Defaults to 500 (the runner's default).
	BatchSize int
	// FillBatch is the number of events per append_events call while
	// filling the log. Defaults to 1,000.
	FillBatch int
	// Rounds is the number of interleaved rounds: each round runs every
	// contender once, and each figure is the median of its rounds.
	// Defaults to 3.
	Rounds int
	// Progress receives a line as each phase starts and while filling.
	// Defaults to none.
	Progress io.Writer
}

// CatchupReport is the outcome of RunCatchup: events per second of each
// contender reading the whole log (the median of Rounds), and the runner's
// ratios to the raw reads.
type CatchupReport struct {
	Events      int     `json:"events"`
	BatchSize   int     `json:"batch_size"`
	Rounds      int     `json:"rounds"`
	FillSeconds float64 `json:"fill_seconds"`
	// Raw reads the log in pages with a plain SELECT, scanning each row into
	// Go values with the payloads as []byte (no JSON decoding): the floor
	// for reading the log from Go.
	Raw float64 `json:"raw_read_events_per_sec"`
	// RawCheckpoint is Raw plus a durable checkpoint UPDATE (autocommit: one
	// commit) after every page.
	RawCheckpoint float64 `json:"raw_read_checkpoint_events_per_sec"`
	// Projection and Observer are a no-op Projection and a no-op Observer
	// through Runner.RunUntilCaughtUp, with the default telemetry (the
	// global OpenTelemetry providers, no-op unless the program sets them).
	Projection float64 `json:"projection_events_per_sec"`
	Observer   float64 `json:"observer_events_per_sec"`
	// ProjectionNoTelemetry and ObserverNoTelemetry are the same with the
	// runner's telemetry switched off altogether (an internal switch): what
	// telemetry with no-op providers costs is 1 - Projection/ProjectionNoTelemetry.
	ProjectionNoTelemetry float64 `json:"projection_no_telemetry_events_per_sec"`
	ObserverNoTelemetry   float64 `json:"observer_no_telemetry_events_per_sec"`

	ProjectionVsRaw           float64 `json:"projection_vs_raw"`
	ObserverVsRaw             float64 `json:"observer_vs_raw"`
	ProjectionVsRawCheckpoint float64 `json:"projection_vs_raw_checkpoint"`
	ObserverVsRawCheckpoint   float64 `json:"observer_vs_raw_checkpoint"`
	ObserverVsProjection      float64 `json:"observer_vs_projection"`
	// ProjectionTelemetryCost and ObserverTelemetryCost are the fractions of
	// throughput the default telemetry costs (negative: within noise).
	ProjectionTelemetryCost float64 `json:"projection_telemetry_cost"`
	ObserverTelemetryCost   float64 `json:"observer_telemetry_cost"`
	// Contenders has every contender's rounds and the CPU time this process
	// spent per event (the client's side; the server's is not included): a
	// figure that a busy machine disturbs far less than throughput.
	Contenders []CatchupContender `json:"contenders"`
}

// CatchupContender is one contender's measurements.
type CatchupContender struct {
	Name string `json:"name"`
	// EventsPerSec is the median of Rounds.
	EventsPerSec float64   `json:"events_per_sec"`
	Rounds       []float64 `json:"rounds_events_per_sec"`
	// CPUPerEvent is the median, over the rounds, of this process's CPU
	// time (user + system) per event, in nanoseconds.
	CPUPerEvent float64 `json:"client_cpu_ns_per_event"`
}

func (c *CatchupConfig) withDefaults() CatchupConfig {
	var out CatchupConfig
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = "annals_bench_catchup"
	}
	if out.Events <= 0 {
		out.Events = 1_000_000
	}
	if out.BatchSize <= 0 {
		out.BatchSize = 500
	}
	if out.FillBatch <= 0 {
		out.FillBatch = 1000
	}
	if out.Rounds <= 0 {
		out.Rounds = 3
	}
	if out.Progress == nil {
		out.Progress = io.Discard
	}
	return out
}

// catchupContender is one way of reading the whole log: it returns the
// number of events it handled.
type catchupContender struct {
	name string
	out  *float64
	fn   func(ctx context.Context) (int, error)
}

// catchupContenders returns the contenders, reporting into rep. Every call
// of a runner contender uses a new subscriber (so it starts from 0).
func catchupContenders(pool *pgxpool.Pool, q map[string]string, c CatchupConfig, rep *CatchupReport) []catchupContender {
	var seq atomic.Int64
	runner := func(telemetry bool, newHandler func(name string) (any, *counter)) func(ctx context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			h, n := newHandler(fmt.Sprintf("bench-catchup-%d", seq.Add(1)))
			err := runnerCatchup(ctx, pool, c, h, telemetry)
			return n.Load(), err
		}
	}
	projection := func(name string) (any, *counter) {
		p := &noopProjection{name: name}
		return p, &p.n
	}
	observer := func(name string) (any, *counter) {
		o := &noopObserver{name: name}
		return o, &o.n
	}
	if rep == nil {
		rep = &CatchupReport{}
	}
	return []catchupContender{
		{"raw read ([]byte payloads)", &rep.Raw, func(ctx context.Context) (int, error) {
			return rawCatchup(ctx, pool, q, c.BatchSize, false)
		}},
		{"raw read + checkpoint", &rep.RawCheckpoint, func(ctx context.Context) (int, error) {
			return rawCatchup(ctx, pool, q, c.BatchSize, true)
		}},
		{"projection (no-op)", &rep.Projection, runner(true, projection)},
		{"observer (no-op)", &rep.Observer, runner(true, observer)},
		{"projection, telemetry off", &rep.ProjectionNoTelemetry, runner(false, projection)},
		{"observer, telemetry off", &rep.ObserverNoTelemetry, runner(false, observer)},
	}
}

// prepareCatchup drops and recreates the schema, fills the log and vacuums
// it; it returns the benchmark's statements.
func prepareCatchup(ctx context.Context, pool *pgxpool.Pool, c CatchupConfig) (map[string]string, error) {
	q, err := freshSchema(ctx, pool, c.Schema)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, q["CheckpointSetup"]); err != nil {
		return nil, errors.Wrap(err, "benchmark: create the baseline checkpoint table")
	}
	if err := fill(ctx, pool, q["Fill"], c); err != nil {
		return nil, err
	}
	fmt.Fprintf(c.Progress, "catch-up: vacuum and analyze the events table ...\n")
	if _, err := pool.Exec(ctx, q["Vacuum"]); err != nil {
		return nil, errors.Wrap(err, "benchmark: vacuum the events table")
	}
	return q, nil
}

// RunCatchup fills a fresh schema with Events events, then measures, in
// Rounds interleaved rounds of the same run (odd rounds in reverse order), a raw paged read of the whole
// log, the same with a checkpoint write per page, and a no-op Projection and
// a no-op Observer catching up from the start, with and without telemetry.
func RunCatchup(ctx context.Context, pool *pgxpool.Pool, cfg *CatchupConfig) (*CatchupReport, error) {
	c := cfg.withDefaults()
	rep := &CatchupReport{Events: c.Events, BatchSize: c.BatchSize, Rounds: c.Rounds}
	start := time.Now()
	q, err := prepareCatchup(ctx, pool, c)
	if err != nil {
		return nil, err
	}
	rep.FillSeconds = time.Since(start).Seconds()

	contenders := catchupContenders(pool, q, c, rep)
	rates := make([][]float64, len(contenders))
	cpu := make([][]float64, len(contenders))
	for round := range c.Rounds {
		for k := range contenders {
			// Odd rounds run in reverse order, so that no contender always
			// follows the same one (a drifting load favours neither).
			i := k
			if round%2 == 1 {
				i = len(contenders) - 1 - k
			}
			ct := contenders[i]
			fmt.Fprintf(c.Progress, "catch-up round %d/%d, %d/%d: %s of %d events ...\n", round+1, c.Rounds, k+1, len(contenders), ct.name, c.Events)
			runtime.GC() // no contender pays for the garbage of the one before
			cpu0 := procstat.Self()
			start := time.Now()
			n, err := ct.fn(ctx)
			elapsed := time.Since(start)
			cpu[i] = append(cpu[i], float64(procstat.Self()-cpu0)/float64(max(n, 1)))
			if err != nil {
				return nil, errors.Wrapf(err, "benchmark: catch-up %s", ct.name)
			}
			if n != c.Events {
				return nil, errors.Newf("benchmark: catch-up %s handled %d events, want %d", ct.name, n, c.Events)
			}
			rates[i] = append(rates[i], float64(n)/elapsed.Seconds())
		}
	}
	for i, ct := range contenders {
		rounds := slices.Clone(rates[i])
		*ct.out = median(rates[i])
		rep.Contenders = append(rep.Contenders, CatchupContender{Name: ct.name, EventsPerSec: *ct.out, Rounds: rounds, CPUPerEvent: median(cpu[i])})
	}
	rep.ProjectionVsRaw = ratio(rep.Projection, rep.Raw)
	rep.ObserverVsRaw = ratio(rep.Observer, rep.Raw)
	rep.ProjectionVsRawCheckpoint = ratio(rep.Projection, rep.RawCheckpoint)
	rep.ObserverVsRawCheckpoint = ratio(rep.Observer, rep.RawCheckpoint)
	rep.ObserverVsProjection = ratio(rep.Observer, rep.Projection)
	rep.ProjectionTelemetryCost = 1 - ratio(rep.Projection, rep.ProjectionNoTelemetry)
	rep.ObserverTelemetryCost = 1 - ratio(rep.Observer, rep.ObserverNoTelemetry)
	return rep, nil
}

// median returns the median of xs (which it sorts).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

// fill appends c.Events events through append_events, FillBatch per call
// and stream, from two writers.
func fill(ctx context.Context, pool *pgxpool.Pool, query string, c CatchupConfig) error {
	calls := (c.Events + c.FillBatch - 1) / c.FillBatch
	var next, done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	start := time.Now()
	var mu sync.Mutex
	reported := 0
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= calls || ctx.Err() != nil {
					return
				}
				n := min(c.FillBatch, c.Events-i*c.FillBatch)
				payload, err := makePayload(n)
				if err != nil {
					errs <- err
					return
				}
				var got int
				if err := pool.QueryRow(ctx, query, fmt.Sprintf("catchup-%d", i), payload).Scan(&got); err != nil {
					errs <- errors.Wrap(err, "benchmark: fill the log")
					return
				}
				total := int(done.Add(int64(got)))
				mu.Lock()
				if step := max(c.Events/10, 1); total/step > reported/step || total == c.Events {
					reported = total
					fmt.Fprintf(c.Progress, "catch-up: filled %d/%d events (%.1fs)\n", total, c.Events, time.Since(start).Seconds())
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return ctx.Err()
}

// rawEvent is a row as the raw reader scans it: every column into a Go
// value, the payloads as bytes, as stored (no JSON decoding).
type rawEvent struct {
	position, version int64
	id                [16]byte
	stream, typ       string
	data, metadata    []byte
	recorded          time.Time
}

// rawCatchup reads the whole log the way a careful hand-written consumer
// would: a page at a time, each row scanned into a rawEvent (payloads as
// []byte, which pgx copies out of its read buffer), optionally writing a
// checkpoint (one autocommit UPDATE, so one commit) after each page. It
// returns the number of events read.
func rawCatchup(ctx context.Context, pool *pgxpool.Pool, q map[string]string, batch int, checkpoint bool) (int, error) {
	var after int64
	n := 0
	for {
		rows, err := pool.Query(ctx, q["ReadEvents"], after, batch)
		if err != nil {
			return n, errors.Wrap(err, "read")
		}
		page := make([]rawEvent, 0, batch)
		var e rawEvent
		_, err = pgx.ForEachRow(rows, []any{&e.position, &e.id, &e.stream, &e.version, &e.typ, &e.data, &e.metadata, &e.recorded}, func() error {
			page = append(page, e)
			return nil
		})
		if err != nil {
			return n, errors.Wrap(err, "read")
		}
		for _, e := range page {
			after = e.position
			n++
		}
		if checkpoint && len(page) > 0 {
			if _, err := pool.Exec(ctx, q["RawCheckpoint"], after); err != nil {
				return n, errors.Wrap(err, "write the checkpoint")
			}
		}
		if len(page) < batch {
			return n, nil
		}
	}
}

// runnerCatchup runs handler from the start of the log to its head through
// a Runner of its own, with the default telemetry or with none.
func runnerCatchup(ctx context.Context, pool *pgxpool.Pool, c CatchupConfig, handler any, withTelemetry bool) error {
	cfg := &projection.Config{Schema: c.Schema}
	if !withTelemetry {
		cfg.TracerProvider = telemetry.Off
	}
	r, err := projection.NewRunner(pool, cfg)
	if err != nil {
		return err
	}
	if err := r.Register(handler, &projection.Options{BatchSize: c.BatchSize}); err != nil {
		return err
	}
	return r.RunUntilCaughtUp(ctx)
}

// noopProjection counts the events it is given and does nothing else.
type noopProjection struct {
	name string
	n    counter
}

func (p *noopProjection) Name() string { return p.name }

func (p *noopProjection) Handle(context.Context, pgx.Tx, eventstore.Event) error {
	p.n.add()
	return nil
}

// noopObserver counts the events it is given and does nothing else.
type noopObserver struct {
	name string
	n    counter
}

func (o *noopObserver) Name() string { return o.name }

func (o *noopObserver) Handle(context.Context, eventstore.Event) error {
	o.n.add()
	return nil
}

// counter counts handled events.
type counter struct{ v atomic.Int64 }

func (c *counter) add()      { c.v.Add(1) }
func (c *counter) Load() int { return int(c.v.Load()) }

// WriteCatchupTable prints the report as an aligned table.
func WriteCatchupTable(w io.Writer, s Settings, rep *CatchupReport) error {
	fmt.Fprintf(w, "catch-up throughput, events/s: %d events read %d at a time, median of %d interleaved rounds (%s)\n", rep.Events, rep.BatchSize, rep.Rounds, s)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tevents/s\tvs raw read\tvs raw read + checkpoint\tclient CPU ns/event\trounds, events/s\t")
	for _, ct := range rep.Contenders {
		rounds := make([]string, len(ct.Rounds))
		for i, r := range ct.Rounds {
			rounds[i] = fmt.Sprintf("%.0f", r)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%.2f\t%.0f\t%s\t\n", ct.Name, ct.EventsPerSec, ratio(ct.EventsPerSec, rep.Raw),
			ratio(ct.EventsPerSec, rep.RawCheckpoint), ct.CPUPerEvent, strings.Join(rounds, " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "observer/projection %.2f; telemetry (no-op providers) costs projection %.1f%%, observer %.1f%%\n",
		rep.ObserverVsProjection, 100*rep.ProjectionTelemetryCost, 100*rep.ObserverTelemetryCost)
	return err
}
