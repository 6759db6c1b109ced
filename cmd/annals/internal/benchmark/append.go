package benchmark

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
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
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/migrations"
)

//go:embed bench.sql
var benchSQL string

// AppendConfig configures RunAppend. A nil *AppendConfig means defaults.
type AppendConfig struct {
	// Schema is the schema the benchmark creates, migrates and uses; its
	// events are left behind for inspection. Defaults to "annals_bench".
	Schema string
	// Writers lists the numbers of concurrent writers. Defaults to 1, 4, 16.
	Writers []int
	// Batches lists the numbers of events per append. Defaults to 1, 100.
	Batches []int
	// Duration is how long each measurement runs. Defaults to 3s.
	Duration time.Duration
	// Rounds is how many times each contender runs each combination. The
	// rounds interleave: a round measures every combination once, its
	// contenders in an order that rotates from combination to combination
	// and from round to round, so that none always runs first (on a fresh
	// table, after a checkpoint) or last. Each figure is the median of its
	// rounds. Defaults to 3.
	Rounds int
	// Progress receives a line as each measurement starts. Defaults to none.
	Progress io.Writer
}

// AppendResult is one combination of writers and batch size.
type AppendResult struct {
	Writers int `json:"writers"`
	Batch   int `json:"batch"`
	// Events per second of each contender: the median of its rounds.
	Raw       float64 `json:"raw_insert_events_per_sec"`
	RawLocked float64 `json:"raw_insert_locked_events_per_sec"`
	Annals    float64 `json:"annals_events_per_sec"`
	// Ratios of annals' median to the baselines' medians.
	VsRaw       float64 `json:"annals_vs_raw"`
	VsRawLocked float64 `json:"annals_vs_raw_locked"`
	// CPU is the CPU time each contender spent per event (each part's
	// median over the rounds).
	CPU AppendCPU `json:"cpu_us_per_event"`
	// Rounds holds each round's rates, in round order.
	Rounds AppendRounds `json:"rounds"`
}

// AppendRounds is the rate of each contender in each round, in events per
// second, and annals' ratio to raw's within each round.
type AppendRounds struct {
	Raw       []float64 `json:"raw_insert"`
	RawLocked []float64 `json:"raw_insert_locked"`
	Annals    []float64 `json:"annals"`
	VsRaw     []float64 `json:"annals_vs_raw"`
}

// AppendCPU is the CPU time per event, in microseconds, of each contender:
// the PostgreSQL server's (all of its processes: backends, WAL writer,
// checkpointer) and the benchmark process's. A machine's load moves the
// rates but not these, so they compare runs on a noisy machine. The
// server's figures are absent when the server does not run on this
// machine (AppendReport.ServerCPUNote says why).
type AppendCPU struct {
	RawServer       *float64 `json:"raw_server,omitempty"`
	RawLockedServer *float64 `json:"raw_locked_server,omitempty"`
	AnnalsServer    *float64 `json:"annals_server,omitempty"`
	RawClient       float64  `json:"raw_client"`
	RawLockedClient float64  `json:"raw_locked_client"`
	AnnalsClient    float64  `json:"annals_client"`
	// AnnalsVsRawServer is annals' server CPU per event over raw's (below
	// 1: annals costs the server less per event); absent with the server's
	// figures.
	AnnalsVsRawServer *float64 `json:"annals_vs_raw_server,omitempty"`
	// AnnalsVsRawTotal is the same ratio of server and client CPU together;
	// absent with the server's figures.
	AnnalsVsRawTotal *float64 `json:"annals_vs_raw_total,omitempty"`
}

// AppendReport is the outcome of RunAppend.
type AppendReport struct {
	Server            string `json:"server_version"`
	Fsync             string `json:"fsync"`
	SynchronousCommit string `json:"synchronous_commit"`
	DurationPerRun    string `json:"duration_per_run"`
	// Rounds is the number of interleaved rounds each figure is the
	// median of.
	Rounds int `json:"rounds"`
	// ServerCPUNote says why the server's CPU time was not measured; empty
	// when it was.
	ServerCPUNote string         `json:"server_cpu_note,omitempty"`
	Results       []AppendResult `json:"results"`
}

func (c *AppendConfig) withDefaults() AppendConfig {
	var out AppendConfig
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = "annals_bench"
	}
	if len(out.Writers) == 0 {
		out.Writers = []int{1, 4, 16}
	}
	if len(out.Batches) == 0 {
		out.Batches = []int{1, 100}
	}
	if out.Duration <= 0 {
		out.Duration = 3 * time.Second
	}
	if out.Rounds <= 0 {
		out.Rounds = 3
	}
	if out.Progress == nil {
		out.Progress = io.Discard
	}
	return out
}

// RunAppend measures append throughput. The pool must allow at least as
// many connections as the largest writer count.
func RunAppend(ctx context.Context, pool *pgxpool.Pool, cfg *AppendConfig) (*AppendReport, error) {
	c := cfg.withDefaults()
	if err := schemaname.Validate(c.Schema); err != nil {
		return nil, err
	}
	for _, w := range c.Writers {
		if w < 1 || w > int(pool.Config().MaxConns) {
			return nil, errors.Newf("benchmark: %d writers need 1..%d pool connections", w, pool.Config().MaxConns)
		}
	}
	for _, b := range c.Batches {
		if b < 1 {
			return nil, errors.Newf("benchmark: batch size %d must be at least 1", b)
		}
	}
	if _, err := migrations.Up(ctx, pool, &migrations.Config{Schema: c.Schema}); err != nil {
		return nil, err
	}
	q, err := sqltmpl.Named("bench.sql", benchSQL, sqltmpl.NewData(c.Schema))
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, q["Setup"]); err != nil {
		return nil, errors.Wrap(err, "benchmark: create the baseline table")
	}
	defer func() { _, _ = pool.Exec(context.WithoutCancel(ctx), q["Teardown"]) }()
	store, err := eventstore.New(pool, &eventstore.Config{Schema: c.Schema})
	if err != nil {
		return nil, err
	}
	rep := &AppendReport{DurationPerRun: c.Duration.String(), Rounds: c.Rounds}
	if err := pool.QueryRow(ctx, q["Settings"]).Scan(&rep.Fsync, &rep.SynchronousCommit, &rep.Server); err != nil {
		return nil, errors.Wrap(err, "benchmark: read server settings")
	}
	meter, why := newCPUMeter(ctx, pool)
	rep.ServerCPUNote = why
	k1, k2 := lockkey.Pair(c.Schema + ":bench-baseline")
	contenders := [contenderCount]appendFunc{
		rawAppend(q["RawInsert"], "", 0, 0),
		rawAppend(q["RawInsert"], q["Lock"], k1, k2),
		func(ctx context.Context, _ *pgxpool.Pool, stream string, version int64, n int) error {
			_, err := store.Append(ctx, stream, eventstore.Exact(version), makeEvents(n)...)
			return err
		},
	}
	type combination struct{ writers, batch int }
	var combos []combination
	for _, w := range c.Writers {
		for _, b := range c.Batches {
			combos = append(combos, combination{w, b})
		}
	}
	// rounds[i][k] is contender k's measurements of combination i.
	rounds := make([][contenderCount]contenderRounds, len(combos))
	// The annals streams stay in the schema after a run: each run appends to
	// streams of its own, so the next one on the same database starts at
	// version 0 again.
	runID := uuid.NewString()[:8]
	order := []int{rawContender, rawLockedContender, annalsContender}
	for round := range c.Rounds {
		for i, cb := range combos {
			fmt.Fprintf(c.Progress, "append round %d/%d, %d/%d: %d writer(s), %d event(s) per append ...\n",
				round+1, c.Rounds, i+1, len(combos), cb.writers, cb.batch)
			for _, k := range rotate(order, round+i) {
				before, err := meter.sample()
				if err != nil {
					return nil, err
				}
				prefix := fmt.Sprintf("%s-r%d-%d-%d-%d", runID, round, i, k, cb.writers)
				events, rate, err := measure(ctx, pool, prefix, cb.writers, cb.batch, c.Duration, contenders[k])
				if err != nil {
					return nil, err
				}
				after, err := meter.sample()
				if err != nil {
					return nil, err
				}
				server, client := meter.perEvent(before, after, events)
				rounds[i][k].add(rate, server, client)
			}
		}
	}
	for i, cb := range combos {
		raw, locked, ann := &rounds[i][rawContender], &rounds[i][rawLockedContender], &rounds[i][annalsContender]
		r := AppendResult{Writers: cb.writers, Batch: cb.batch}
		r.Rounds = AppendRounds{Raw: raw.rates, RawLocked: locked.rates, Annals: ann.rates}
		for j := range ann.rates {
			r.Rounds.VsRaw = append(r.Rounds.VsRaw, ann.rates[j]/raw.rates[j])
		}
		r.Raw, r.RawLocked, r.Annals = raw.rate(), locked.rate(), ann.rate()
		r.VsRaw = r.Annals / r.Raw
		r.VsRawLocked = r.Annals / r.RawLocked
		r.CPU.RawServer, r.CPU.RawClient = raw.cpu()
		r.CPU.RawLockedServer, r.CPU.RawLockedClient = locked.cpu()
		r.CPU.AnnalsServer, r.CPU.AnnalsClient = ann.cpu()
		if r.CPU.RawServer != nil && *r.CPU.RawServer > 0 {
			server := *r.CPU.AnnalsServer / *r.CPU.RawServer
			total := (*r.CPU.AnnalsServer + r.CPU.AnnalsClient) / (*r.CPU.RawServer + r.CPU.RawClient)
			r.CPU.AnnalsVsRawServer, r.CPU.AnnalsVsRawTotal = &server, &total
		}
		rep.Results = append(rep.Results, r)
	}
	return rep, nil
}

// The append benchmark's contenders, by index.
const (
	rawContender = iota
	rawLockedContender
	annalsContender
	contenderCount
)

// contenderRounds is one contender's measurements of one combination, a
// round each.
type contenderRounds struct {
	rates, client []float64
	// server is nil when the server's CPU time is not measured.
	server []float64
}

func (c *contenderRounds) add(rate float64, server *float64, client float64) {
	c.rates = append(c.rates, rate)
	c.client = append(c.client, client)
	if server != nil {
		c.server = append(c.server, *server)
	}
}

// rate is the median rate.
func (c *contenderRounds) rate() float64 { return median(slices.Clone(c.rates)) }

// cpu is the median CPU time per event of the server (nil when not
// measured in every round) and of this process.
func (c *contenderRounds) cpu() (server *float64, client float64) {
	if len(c.server) == len(c.rates) && len(c.server) > 0 {
		m := median(slices.Clone(c.server))
		server = &m
	}
	return server, median(slices.Clone(c.client))
}

// rotate returns s started at its k-th element (k taken modulo len(s)).
func rotate[T any](s []T, k int) []T {
	if len(s) == 0 {
		return nil
	}
	k %= len(s)
	return append(slices.Clone(s[k:]), s[:k]...)
}

// appendFunc appends n new events at the stream's current version. Each
// contender builds its own input, so each pays for encoding it once.
type appendFunc func(ctx context.Context, pool *pgxpool.Pool, stream string, version int64, n int) error

func rawAppend(insert, lock string, k1, k2 int32) appendFunc {
	return func(ctx context.Context, pool *pgxpool.Pool, stream string, version int64, n int) error {
		payload, err := makePayload(n)
		if err != nil {
			return err
		}
		batch := &pgx.Batch{}
		if lock != "" {
			batch.Queue(lock, k1, k2)
		}
		batch.Queue(insert, stream, version, payload)
		// A batch without BEGIN runs as one implicit transaction in one round trip.
		return pool.SendBatch(ctx, batch).Close()
	}
}

// measure runs writers concurrently for d, each appending batches of n events
// to streams of its own, and returns the events appended and events per
// second.
func measure(ctx context.Context, pool *pgxpool.Pool, prefix string, writers, n int, d time.Duration, fn appendFunc) (int64, float64, error) {
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	start := time.Now()
	deadline := start.Add(d)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream := fmt.Sprintf("%s-w%d", prefix, w)
			var version int64
			for time.Now().Before(deadline) {
				if err := fn(ctx, pool, stream, version, n); err != nil {
					errs <- errors.Wrapf(err, "writer %d", w)
					return
				}
				version += int64(n)
				total.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, err
	}
	return total.Load(), float64(total.Load()) / elapsed.Seconds(), nil
}

var payloadNote = strings.Repeat("x", 120)

// eventData is the payload of one benchmark event, about 200 bytes of JSON.
func eventData(i int) map[string]any {
	return map[string]any{"amount": i, "currency": "EUR", "note": payloadNote}
}

// makeEvents returns n events for the annals contender.
func makeEvents(n int) []eventstore.EventData {
	events := make([]eventstore.EventData, n)
	for i := range events {
		id, _ := uuid.NewV7()
		events[i] = eventstore.EventData{ID: id, Type: "bench.deposited", Data: eventData(i)}
	}
	return events
}

// makePayload returns the JSON array of n new events for the raw
// contenders, in the shape append_events takes.
func makePayload(n int) (json.RawMessage, error) {
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i], _ = uuid.NewV7()
	}
	return payloadFor(ids)
}

// WriteAppendTable prints the report as an aligned table.
func WriteAppendTable(w io.Writer, rep *AppendReport) error {
	fmt.Fprintf(w, "append throughput, events/s, medians of %d interleaved round(s) (PostgreSQL %s, fsync=%s, synchronous_commit=%s, %s per run)\n",
		rep.Rounds, rep.Server, rep.Fsync, rep.SynchronousCommit, rep.DurationPerRun)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "writers\tevents/append\traw insert\traw insert + lock\tannals\tannals/raw\tannals/raw+lock\tannals/raw by round\t")
	for _, r := range rep.Results {
		byRound := make([]string, len(r.Rounds.VsRaw))
		for i, x := range r.Rounds.VsRaw {
			byRound[i] = fmt.Sprintf("%.2f", x)
		}
		fmt.Fprintf(tw, "%d\t%d\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t%s\t\n", r.Writers, r.Batch, r.Raw, r.RawLocked, r.Annals, r.VsRaw, r.VsRawLocked,
			strings.Join(byRound, " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if rep.ServerCPUNote != "" {
		fmt.Fprintf(w, "CPU per event, µs, of this process only: %s\n", rep.ServerCPUNote)
	} else {
		fmt.Fprintln(w, "CPU per event, µs (medians): PostgreSQL's processes + this process")
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "writers\tevents/append\traw insert\traw insert + lock\tannals\tannals/raw server\tannals/raw total\t")
	cell := func(server *float64, client float64) string {
		if server == nil {
			return fmt.Sprintf("%.1f", client)
		}
		return fmt.Sprintf("%.1f + %.1f", *server, client)
	}
	ratio := func(x *float64) string {
		if x == nil {
			return "-"
		}
		return fmt.Sprintf("%.2f", *x)
	}
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Writers, r.Batch,
			cell(r.CPU.RawServer, r.CPU.RawClient), cell(r.CPU.RawLockedServer, r.CPU.RawLockedClient),
			cell(r.CPU.AnnalsServer, r.CPU.AnnalsClient), ratio(r.CPU.AnnalsVsRawServer), ratio(r.CPU.AnnalsVsRawTotal))
	}
	return tw.Flush()
}
