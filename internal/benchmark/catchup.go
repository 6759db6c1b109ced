package benchmark

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
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
	// Progress receives a line as each phase starts and while filling.
	// Defaults to none.
	Progress io.Writer
}

// CatchupReport is the outcome of RunCatchup: events per second of each
// contender reading the whole log, and the runner's ratios to the raw reads.
type CatchupReport struct {
	Events      int     `json:"events"`
	BatchSize   int     `json:"batch_size"`
	FillSeconds float64 `json:"fill_seconds"`
	// Raw reads the log in pages with a plain SELECT and decodes the rows
	// into eventstore.Event values.
	Raw float64 `json:"raw_read_events_per_sec"`
	// RawCheckpoint is Raw plus a durable checkpoint UPDATE (autocommit)
	// after every page.
	RawCheckpoint float64 `json:"raw_read_checkpoint_events_per_sec"`
	// Projection and Observer are a no-op Projection and a no-op Observer
	// through Runner.RunUntilCaughtUp.
	Projection float64 `json:"projection_events_per_sec"`
	Observer   float64 `json:"observer_events_per_sec"`

	ProjectionVsRaw           float64 `json:"projection_vs_raw"`
	ObserverVsRaw             float64 `json:"observer_vs_raw"`
	ProjectionVsRawCheckpoint float64 `json:"projection_vs_raw_checkpoint"`
	ObserverVsRawCheckpoint   float64 `json:"observer_vs_raw_checkpoint"`
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
	if out.Progress == nil {
		out.Progress = io.Discard
	}
	return out
}

// RunCatchup fills a fresh schema with Events events, then measures, one
// after the other in the same run, a raw paged read of the whole log, the
// same with a checkpoint write per page, a no-op Projection and a no-op
// Observer catching up from the start.
func RunCatchup(ctx context.Context, pool *pgxpool.Pool, cfg *CatchupConfig) (*CatchupReport, error) {
	c := cfg.withDefaults()
	q, err := freshSchema(ctx, pool, c.Schema)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, q["CheckpointSetup"]); err != nil {
		return nil, errors.Wrap(err, "benchmark: create the baseline checkpoint table")
	}
	rep := &CatchupReport{Events: c.Events, BatchSize: c.BatchSize}
	start := time.Now()
	if err := fill(ctx, pool, q["Fill"], c); err != nil {
		return nil, err
	}
	fmt.Fprintf(c.Progress, "catch-up: vacuum and analyze the events table ...\n")
	if _, err := pool.Exec(ctx, q["Vacuum"]); err != nil {
		return nil, errors.Wrap(err, "benchmark: vacuum the events table")
	}
	rep.FillSeconds = time.Since(start).Seconds()

	contenders := []struct {
		name string
		out  *float64
		fn   func(ctx context.Context) (int, error)
	}{
		{"raw read", &rep.Raw, func(ctx context.Context) (int, error) {
			return rawCatchup(ctx, pool, q, c.BatchSize, false)
		}},
		{"raw read + checkpoint", &rep.RawCheckpoint, func(ctx context.Context) (int, error) {
			return rawCatchup(ctx, pool, q, c.BatchSize, true)
		}},
		{"projection", &rep.Projection, func(ctx context.Context) (int, error) {
			p := &noopProjection{name: "bench-catchup-projection"}
			err := runnerCatchup(ctx, pool, c, p)
			return p.n.Load(), err
		}},
		{"observer", &rep.Observer, func(ctx context.Context) (int, error) {
			o := &noopObserver{name: "bench-catchup-observer"}
			err := runnerCatchup(ctx, pool, c, o)
			return o.n.Load(), err
		}},
	}
	for i, ct := range contenders {
		fmt.Fprintf(c.Progress, "catch-up %d/%d: %s of %d events ...\n", i+1, len(contenders), ct.name, c.Events)
		start := time.Now()
		n, err := ct.fn(ctx)
		elapsed := time.Since(start)
		if err != nil {
			return nil, errors.Wrapf(err, "benchmark: catch-up %s", ct.name)
		}
		if n != c.Events {
			return nil, errors.Newf("benchmark: catch-up %s handled %d events, want %d", ct.name, n, c.Events)
		}
		*ct.out = float64(n) / elapsed.Seconds()
	}
	rep.ProjectionVsRaw = ratio(rep.Projection, rep.Raw)
	rep.ObserverVsRaw = ratio(rep.Observer, rep.Raw)
	rep.ProjectionVsRawCheckpoint = ratio(rep.Projection, rep.RawCheckpoint)
	rep.ObserverVsRawCheckpoint = ratio(rep.Observer, rep.RawCheckpoint)
	return rep, nil
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

// rawCatchup reads the whole log the way a hand-written consumer would: a
// page at a time, decoded into eventstore.Event values, optionally writing a
// checkpoint after each page. It returns the number of events read.
func rawCatchup(ctx context.Context, pool *pgxpool.Pool, q map[string]string, batch int, checkpoint bool) (int, error) {
	var after int64
	n := 0
	for {
		rows, err := pool.Query(ctx, q["ReadEvents"], after, batch)
		if err != nil {
			return n, errors.Wrap(err, "read")
		}
		events, err := eventstore.ScanEvents(rows, batch)
		if err != nil {
			return n, errors.Wrap(err, "read")
		}
		for _, e := range events {
			after = e.GlobalSequence
			n++
		}
		if checkpoint && len(events) > 0 {
			if _, err := pool.Exec(ctx, q["RawCheckpoint"], after); err != nil {
				return n, errors.Wrap(err, "write the checkpoint")
			}
		}
		if len(events) < batch {
			return n, nil
		}
	}
}

// runnerCatchup runs handler from the start of the log to its head through
// a Runner of its own.
func runnerCatchup(ctx context.Context, pool *pgxpool.Pool, c CatchupConfig, handler any) error {
	r, err := projection.NewRunner(pool, &projection.Config{Schema: c.Schema})
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
	fmt.Fprintf(w, "catch-up throughput, events/s: %d events read %d at a time (%s)\n", rep.Events, rep.BatchSize, s)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tevents/s\tvs raw read\tvs raw read + checkpoint\t")
	rows := []struct {
		name string
		rate float64
	}{
		{"raw read", rep.Raw},
		{"raw read + checkpoint", rep.RawCheckpoint},
		{"projection (no-op)", rep.Projection},
		{"observer (no-op)", rep.Observer},
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%.2f\t\n", r.name, r.rate, ratio(r.rate, rep.Raw), ratio(r.rate, rep.RawCheckpoint))
	}
	return tw.Flush()
}
