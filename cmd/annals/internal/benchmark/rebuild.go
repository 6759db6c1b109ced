package benchmark

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/projection"
)

//go:embed rebuild.sql
var rebuildSQL string

// RebuildConfig configures RunRebuild. A nil *RebuildConfig means defaults.
type RebuildConfig struct {
	// Schema is the schema the benchmark drops, recreates, fills and leaves
	// behind for inspection. Defaults to "annals_bench_rebuild".
	Schema string
	// Events is the number of events in the log, all replayed. Defaults to
	// 200,000.
	Events int
	// BatchSize is the number of events per transaction of both
	// contenders. Defaults to 5,000 (Rebuild's default).
	BatchSize int
	// Progress receives a line as each phase starts and while filling.
	// Defaults to none.
	Progress io.Writer
}

// RebuildReport is the outcome of RunRebuild.
type RebuildReport struct {
	Events      int     `json:"events"`
	BatchSize   int     `json:"batch_size"`
	FillSeconds float64 `json:"fill_seconds"`
	// Raw clears the read model, then reads the log a page at a time and
	// applies each page in one transaction: per event a JSON decode and an
	// upsert, per page a checkpoint UPDATE.
	Raw float64 `json:"raw_events_per_sec"`
	// Rebuild is projection.Runner.Rebuild of a projection doing the same
	// decode and upsert per event (the rebuild's own work: taking the lock,
	// counting the events, resetting with the checkpoint, replaying).
	Rebuild        float64 `json:"rebuild_events_per_sec"`
	RebuildSeconds float64 `json:"rebuild_seconds"`
	RebuildVsRaw   float64 `json:"rebuild_vs_raw"`
	// BlueGreen is projection.Runner.RebuildBlueGreen of the same work into
	// a new generation's schema (setting it up, the replay with the
	// search_path set per transaction, the cut-over that creates the view),
	// and BlueGreenCutoverMS its cut-over transaction.
	BlueGreen          float64 `json:"bluegreen_events_per_sec"`
	BlueGreenSeconds   float64 `json:"bluegreen_seconds"`
	BlueGreenVsRaw     float64 `json:"bluegreen_vs_raw"`
	BlueGreenCutoverMS float64 `json:"bluegreen_cutover_ms"`
}

func (c *RebuildConfig) withDefaults() RebuildConfig {
	var out RebuildConfig
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = "annals_bench_rebuild"
	}
	if out.Events <= 0 {
		out.Events = 200_000
	}
	if out.BatchSize <= 0 {
		out.BatchSize = 5000
	}
	if out.Progress == nil {
		out.Progress = io.Discard
	}
	return out
}

// RunRebuild fills a fresh schema with Events events, then, in the same run:
// a raw warm-up pass (unmeasured: it builds the read model and warms the
// cache, so that both measured contenders start from a full read model),
// the rebuild, and the raw pass again.
func RunRebuild(ctx context.Context, pool *pgxpool.Pool, cfg *RebuildConfig) (*RebuildReport, error) {
	c := cfg.withDefaults()
	q, err := freshSchema(ctx, pool, c.Schema)
	if err != nil {
		return nil, err
	}
	rq, err := sqltmpl.Named("rebuild.sql", rebuildSQL, sqltmpl.NewData(c.Schema))
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, rq["Setup"]); err != nil {
		return nil, errors.Wrap(err, "benchmark: create the rebuild read model")
	}
	if _, err := pool.Exec(ctx, rq["BlueGreenSetup"]); err != nil {
		return nil, errors.Wrap(err, "benchmark: drop the blue/green generations of an earlier run")
	}
	rep := &RebuildReport{Events: c.Events, BatchSize: c.BatchSize}
	start := time.Now()
	fillCfg := CatchupConfig{Events: c.Events, FillBatch: 1000, Progress: c.Progress}
	fmt.Fprintf(c.Progress, "rebuild: filling %d events ...\n", c.Events)
	if err := fill(ctx, pool, q["Fill"], fillCfg); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, q["Vacuum"]); err != nil {
		return nil, errors.Wrap(err, "benchmark: vacuum the events table")
	}
	rep.FillSeconds = time.Since(start).Seconds()

	runner, err := projection.NewRunner(pool, &projection.Config{Schema: c.Schema})
	if err != nil {
		return nil, err
	}
	if err := runner.Register(&rebuildProjection{q: rq}, nil); err != nil {
		return nil, err
	}
	bg := &blueGreenProjection{rebuildProjection{q: rq}}
	if err := runner.Register(bg, &projection.Options{BlueGreen: &projection.BlueGreen{Version: 1, ReaderSchema: c.Schema}}); err != nil {
		return nil, err
	}
	contenders := []struct {
		name string
		out  *float64
		fn   func(ctx context.Context) (int, error)
	}{
		{"raw (warm-up)", nil, func(ctx context.Context) (int, error) { return rawRebuild(ctx, pool, q, rq, c.BatchSize) }},
		{"rebuild", &rep.Rebuild, func(ctx context.Context) (int, error) {
			var done int64
			err := runner.Rebuild(ctx, rebuildProjectionName, &projection.RebuildOptions{BatchSize: c.BatchSize,
				OnProgress: func(p projection.RebuildProgress) { done = p.Done }})
			return int(done), err
		}},
		{"raw", &rep.Raw, func(ctx context.Context) (int, error) { return rawRebuild(ctx, pool, q, rq, c.BatchSize) }},
		{"blue/green", &rep.BlueGreen, func(ctx context.Context) (int, error) {
			var done int64
			cut, err := runner.RebuildBlueGreen(ctx, blueGreenProjectionName, &projection.RebuildOptions{BatchSize: c.BatchSize,
				OnProgress: func(p projection.RebuildProgress) { done = p.Done }})
			rep.BlueGreenCutoverMS = float64(cut.Duration.Microseconds()) / 1000
			return int(done), err
		}},
	}
	for i, ct := range contenders {
		fmt.Fprintf(c.Progress, "rebuild %d/%d: %s of %d events ...\n", i+1, len(contenders), ct.name, c.Events)
		start := time.Now()
		n, err := ct.fn(ctx)
		elapsed := time.Since(start)
		if err != nil {
			return nil, errors.Wrapf(err, "benchmark: rebuild %s", ct.name)
		}
		var counted int
		check := rq["Check"]
		if ct.name == "blue/green" {
			check = rq["BlueGreenCheck"]
		}
		if err := pool.QueryRow(ctx, check).Scan(&counted); err != nil {
			return nil, errors.Wrap(err, "benchmark: check the read model")
		}
		if n != c.Events || counted != c.Events {
			return nil, errors.Newf("benchmark: rebuild %s replayed %d events and left %d in the read model, want %d", ct.name, n, counted, c.Events)
		}
		if ct.out != nil {
			*ct.out = float64(n) / elapsed.Seconds()
		}
		if ct.name == "rebuild" {
			rep.RebuildSeconds = elapsed.Seconds()
		}
		if ct.name == "blue/green" {
			rep.BlueGreenSeconds = elapsed.Seconds()
		}
	}
	rep.RebuildVsRaw = ratio(rep.Rebuild, rep.Raw)
	rep.BlueGreenVsRaw = ratio(rep.BlueGreen, rep.Raw)
	return rep, nil
}

// rawRebuild is what a hand-written rebuild does on one connection: clear
// the read model and the checkpoint in one transaction, then per page of
// events one transaction with a decode and an upsert per event and the
// checkpoint. It returns the number of events applied.
func rawRebuild(ctx context.Context, pool *pgxpool.Pool, q, rq map[string]string, batch int) (int, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, errors.Wrap(err, "acquire a connection")
	}
	defer conn.Release()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, rq["Reset"]); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, rq["RawCheckpoint"], 0)
		return err
	})
	if err != nil {
		return 0, errors.Wrap(err, "reset")
	}
	var after int64
	n := 0
	for {
		rows, err := conn.Query(ctx, q["ReadEvents"], after, batch)
		if err != nil {
			return n, errors.Wrap(err, "read")
		}
		events, err := eventstore.ScanEvents(rows, batch)
		if err != nil {
			return n, errors.Wrap(err, "read")
		}
		if len(events) == 0 {
			return n, nil
		}
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			for _, e := range events {
				if err := applyDeposit(ctx, tx, rq["Upsert"], e); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, rq["RawCheckpoint"], events[len(events)-1].GlobalSequence)
			return err
		})
		if err != nil {
			return n, errors.Wrap(err, "apply a page")
		}
		n += len(events)
		after = events[len(events)-1].GlobalSequence
		if len(events) < batch {
			return n, nil
		}
	}
}

// applyDeposit is the per-event work of both contenders.
func applyDeposit(ctx context.Context, tx pgx.Tx, upsert string, e eventstore.Event) error {
	var d struct {
		Amount int64 `json:"amount"`
	}
	if err := json.Unmarshal(e.Data, &d); err != nil {
		return errors.Wrapf(err, "decode event %d", e.GlobalSequence)
	}
	_, err := tx.Exec(ctx, upsert, e.StreamID, d.Amount)
	return err
}

const rebuildProjectionName = "bench-rebuild-balances"

// rebuildProjection is the rebuilt projection: applyDeposit per event.
type rebuildProjection struct{ q map[string]string }

func (p *rebuildProjection) Name() string { return rebuildProjectionName }

func (p *rebuildProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	return applyDeposit(ctx, tx, p.q["Upsert"], e)
}

func (p *rebuildProjection) Reset(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, p.q["Reset"])
	return err
}

// WriteRebuildTable prints the report as an aligned table.
func WriteRebuildTable(w io.Writer, s Settings, rep *RebuildReport) error {
	fmt.Fprintf(w, "rebuild throughput, events/s: %d events, %d per transaction, a JSON decode and an upsert per event (%s)\n",
		rep.Events, rep.BatchSize, s)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tevents/s\tvs raw\t")
	fmt.Fprintf(tw, "raw reset + paged replay\t%.0f\t%.2f\t\n", rep.Raw, 1.0)
	fmt.Fprintf(tw, "Runner.Rebuild\t%.0f\t%.2f\t\n", rep.Rebuild, rep.RebuildVsRaw)
	fmt.Fprintf(tw, "Runner.RebuildBlueGreen\t%.0f\t%.2f\t\n", rep.BlueGreen, rep.BlueGreenVsRaw)
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "blue/green cut-over transaction: %.2f ms\n", rep.BlueGreenCutoverMS)
	return err
}

const blueGreenProjectionName = "bench_bluegreen"

// blueGreenProjection is the blue/green contender: the same decode and
// upsert, into its generation's table, created by its setup.
type blueGreenProjection struct{ rebuildProjection }

func (p *blueGreenProjection) Name() string { return blueGreenProjectionName }

func (p *blueGreenProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	return applyDeposit(ctx, tx, p.q["BlueGreenUpsert"], e)
}

// SetupVersion and Setup make it a projection.Setupper.
func (p *blueGreenProjection) SetupVersion() int { return 1 }

func (p *blueGreenProjection) Setup(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, p.q["BlueGreenTable"])
	return err
}
