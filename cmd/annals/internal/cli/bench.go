package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/cmd/annals/internal/benchmark"
)

// benchmarks are the names --only accepts, in the order they run.
var benchmarks = []string{"append", "catchup", "latency", "takeover", "rebuild", "scaleout"}

// benchFlagsOf maps each benchmark to its own flags: given without --only,
// they select their benchmarks alone.
var benchFlagsOf = map[string][]string{
	"append":   {"writers", "batch", "append-rounds"},
	"catchup":  {"events"},
	"latency":  {"rates", "latency-writers"},
	"takeover": {"rounds", "lock-retry"},
	"rebuild":  {"rebuild-events"},
	"scaleout": {"scaleout-events"},
}

// cliMainPackage is the main package of the annals command: the takeover
// benchmark re-executes this binary, so it runs only from it.
const cliMainPackage = "github.com/annals-dev/annals/cmd/annals"

// benchJSON is the --json document. The append figures stay at the top
// level, where they have always been; each other benchmark has its key.
type benchJSON struct {
	benchmark.Settings
	DurationPerRun string                    `json:"duration_per_run,omitempty"`
	AppendRounds   int                       `json:"append_rounds,omitempty"`
	Results        []benchmark.AppendResult  `json:"results,omitempty"`
	Catchup        *benchmark.CatchupReport  `json:"catchup,omitempty"`
	Latency        *benchmark.LatencyReport  `json:"latency,omitempty"`
	Takeover       *benchmark.TakeoverReport `json:"takeover,omitempty"`
	Rebuild        *benchmark.RebuildReport  `json:"rebuild,omitempty"`
	Scaleout       *benchmark.ScaleoutReport `json:"scaleout,omitempty"`
}

func (e *env) benchCommand() *cobra.Command {
	var quick bool
	var duration time.Duration
	var jsonPath string
	var format *string
	var only []string
	var writers, batches, rates []int
	var latencyWriters int
	var events, rounds, appendRounds, rebuildEvents, scaleoutEvents int
	var lockRetry []time.Duration
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure annals against raw PostgreSQL doing the same work",
		Long: `Measure annals beside raw PostgreSQL doing the same work in the same run, and print
figures and ratios (tables on stdout, progress on stderr). The benchmarks, chosen with
--only (default: all of them, in this order):

  append    append throughput (1, 4 and 16 writers; 1 and 100 events per append) beside
            a plain INSERT numbered by a sequence and the same INSERT under an advisory
            lock, and each one's CPU time per event (PostgreSQL's, when it runs on this
            machine, and this process's); --append-rounds interleaved rounds (default 3),
            the contenders' order rotating, medians and each round's ratio. Schema
            annals_bench.
  catchup   catch-up throughput: fill a log of --events events, then read it all with a
            raw paged SELECT (payloads scanned into []byte), the same plus a checkpoint
            write per page, a no-op Projection and a no-op Observer
            (Runner.RunUntilCaughtUp, 500 per batch), each also with telemetry off;
            3 interleaved rounds. Schema annals_bench_catchup.
  latency   end-to-end latency from the moment an event is handed out to the start of a live
            observer's Handle, at each of --rates events/s for --duration (open loop,
            shared by --latency-writers writers), beside a raw INSERT + NOTIFY read by
            a raw LISTEN connection; the appends' own durations too. Schema
            annals_bench_latency.
  takeover  leader takeover: two runner processes (this binary, re-executed), the leader
            killed with SIGKILL --rounds times per --lock-retry interval, then stopped
            gracefully 5 times, beside a raw waiter blocked in pg_advisory_lock. Runs only from the annals binary (go run
            ./cmd/annals bench works; go test does not). Schema annals_bench_takeover.
  rebuild   rebuild throughput: fill a log of --rebuild-events events, then replay it into a
            read model (a JSON decode and an upsert per event) with Runner.Rebuild, beside
            a raw reset + paged replay in transactions of the same size (5000 events) with
            a checkpoint UPDATE per transaction. Schema annals_bench_rebuild.
  scaleout  balanced leadership with runner processes (this binary, re-executed) sharing
            16 partitions: the time until a 4th process has its share (3 → 4), and until
            the partitions of a SIGKILLed one of 4 are led again, 10 rounds each; then the
            catch-up throughput of --scaleout-events events with an upsert per event by 1,
            2 and 4 processes. Schema annals_bench_scaleout.

Without --only, a benchmark's own flags (append: --writers, --batch, --append-rounds; catchup: --events;
latency: --rates, --latency-writers; takeover: --rounds, --lock-retry; rebuild: --rebuild-events) select that
benchmark alone. The catch-up, latency, takeover and rebuild schemas are dropped and recreated at the start and left
behind for inspection. Run against a database with fsync on: fsync-off clusters hide the
cost of ordered commits and checkpoint writes. --quick makes every benchmark tiny (a
smoke test).`,
		Example: `  annals bench --json bench-results/all.json
  annals bench --only catchup --events 100000
  annals bench --only takeover --lock-retry 0,100ms,2s --rounds 20`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			run, err := selectBenchmarks(cmd, only)
			if err != nil {
				return err
			}
			if duration < 0 {
				return usagef("--duration must not be negative (0: the default, 3s)")
			}
			appendCfg := &benchmark.AppendConfig{Writers: writers, Batches: batches, Duration: duration, Rounds: appendRounds, Progress: e.stderr}
			catchupCfg := &benchmark.CatchupConfig{Events: events, Progress: e.stderr}
			latencyCfg := &benchmark.LatencyConfig{Rates: rates, Writers: latencyWriters, Duration: duration, Progress: e.stderr}
			takeoverCfg := &benchmark.TakeoverConfig{LockRetry: lockRetry, Rounds: rounds, Progress: e.stderr}
			rebuildCfg := &benchmark.RebuildConfig{Events: rebuildEvents, Progress: e.stderr}
			scaleoutCfg := &benchmark.ScaleoutConfig{Events: scaleoutEvents, Progress: e.stderr}
			if quick {
				appendCfg.Duration = 200 * time.Millisecond
				if len(writers) == 0 {
					appendCfg.Writers = []int{1, 4}
				}
				if !cmd.Flags().Changed("append-rounds") {
					appendCfg.Rounds = 1
				}
				if !cmd.Flags().Changed("events") {
					catchupCfg.Events = 5000
				}
				latencyCfg.Duration = 500 * time.Millisecond
				if len(rates) == 0 {
					latencyCfg.Rates = []int{100}
				}
				if !cmd.Flags().Changed("rounds") {
					takeoverCfg.Rounds = 1
				}
				takeoverCfg.Graceful = 1
				if !cmd.Flags().Changed("rebuild-events") {
					rebuildCfg.Events = 5000
				}
				scaleoutCfg.Rounds = 1
				if !cmd.Flags().Changed("scaleout-events") {
					scaleoutCfg.Events = 5000
				}
			}
			for _, w := range appendCfg.Writers {
				if w < 1 || w > 64 {
					return usagef("--writers %d: want 1..64", w)
				}
			}
			for _, b := range appendCfg.Batches {
				if b < 1 || b > 10000 {
					return usagef("--batch %d: want 1..10000", b)
				}
			}
			if appendCfg.Rounds < 1 || appendCfg.Rounds > 100 {
				return usagef("--append-rounds %d: want 1..100", appendCfg.Rounds)
			}
			if catchupCfg.Events < 1 || catchupCfg.Events > 100_000_000 {
				return usagef("--events %d: want 1..100000000", catchupCfg.Events)
			}
			if rebuildCfg.Events < 1 || rebuildCfg.Events > 100_000_000 {
				return usagef("--rebuild-events %d: want 1..100000000", rebuildCfg.Events)
			}
			if latencyWriters < 1 || latencyWriters > 60 {
				return usagef("--latency-writers %d: want 1..60", latencyWriters)
			}
			for _, r := range latencyCfg.Rates {
				if r < 1 || r > 100_000 {
					return usagef("--rates %d: want 1..100000 events/s", r)
				}
			}
			if scaleoutCfg.Events < 1 || scaleoutCfg.Events > 100_000_000 {
				return usagef("--scaleout-events %d: want 1..100000000", scaleoutCfg.Events)
			}
			if takeoverCfg.Rounds < 1 || takeoverCfg.Rounds > 1000 {
				return usagef("--rounds %d: want 1..1000", takeoverCfg.Rounds)
			}
			for _, d := range takeoverCfg.LockRetry {
				if d < 0 {
					return usagef("--lock-retry %s must not be negative", d)
				}
			}

			ctx := cmd.Context()
			pool, err := e.connectUnpinned(ctx, 64)
			if err != nil {
				return err
			}
			defer pool.Close()
			settings, err := benchmark.ReadSettings(ctx, pool)
			if err != nil {
				return err
			}
			doc := &benchJSON{Settings: settings}
			tables := 0
			if *format == outputJSON {
				// The document on stdout at the end, with what was measured
				// before a failure too (the error follows on stderr).
				defer func() {
					if err == nil || tables > 0 {
						if werr := writeJSON(e.stdout, doc); err == nil {
							err = werr
						}
					}
				}()
			}
			// report prints a table (as text) and rewrites --json, so that a
			// failure later in the run keeps the figures measured so far.
			report := func(write func(io.Writer) error) error {
				tables++
				if *format == outputText {
					if tables > 1 {
						fmt.Fprintln(e.stdout)
					}
					if err := write(e.stdout); err != nil {
						return err
					}
				}
				return writeBenchJSON(jsonPath, doc)
			}

			if run["append"] {
				rep, err := benchmark.RunAppend(ctx, pool, appendCfg)
				if err != nil {
					return err
				}
				doc.DurationPerRun, doc.AppendRounds, doc.Results = rep.DurationPerRun, rep.Rounds, rep.Results
				if err := report(func(w io.Writer) error { return benchmark.WriteAppendTable(w, rep) }); err != nil {
					return err
				}
			}
			if run["catchup"] {
				rep, err := benchmark.RunCatchup(ctx, pool, catchupCfg)
				if err != nil {
					return err
				}
				doc.Catchup = rep
				if err := report(func(w io.Writer) error { return benchmark.WriteCatchupTable(w, settings, rep) }); err != nil {
					return err
				}
			}
			if run["latency"] {
				rep, err := benchmark.RunLatency(ctx, pool, latencyCfg)
				if err != nil {
					return err
				}
				doc.Latency = rep
				if err := report(func(w io.Writer) error { return benchmark.WriteLatencyTable(w, settings, rep) }); err != nil {
					return err
				}
				if jsonPath != "" {
					// The distribution, as a plot next to the JSON.
					svg := strings.TrimSuffix(jsonPath, filepath.Ext(jsonPath)) + "-latency.svg"
					var buf bytes.Buffer
					if err := benchmark.WriteLatencySVG(&buf, rep); err != nil {
						return err
					}
					if err := os.WriteFile(svg, buf.Bytes(), 0o644); err != nil {
						return errors.Wrap(err, "write the latency plot")
					}
					fmt.Fprintf(e.stderr, "latency plot: %s\n", svg)
				}
			}
			if run["takeover"] {
				rep := &benchmark.TakeoverReport{}
				if command, why := takeoverCommand(); why != "" {
					rep.Skipped = why
				} else {
					url := e.databaseURL
					if url == "" {
						url = e.getenv("DATABASE_URL")
					}
					takeoverCfg.Command = command
					// The URL travels in the environment, not on the command line.
					takeoverCfg.Env = append(os.Environ(), "DATABASE_URL="+url)
					if rep, err = benchmark.RunTakeover(ctx, pool, takeoverCfg); err != nil {
						return err
					}
				}
				doc.Takeover = rep
				if err := report(func(w io.Writer) error { return benchmark.WriteTakeoverTable(w, settings, rep) }); err != nil {
					return err
				}
			}
			if run["rebuild"] {
				rep, err := benchmark.RunRebuild(ctx, pool, rebuildCfg)
				if err != nil {
					return err
				}
				doc.Rebuild = rep
				if err := report(func(w io.Writer) error { return benchmark.WriteRebuildTable(w, settings, rep) }); err != nil {
					return err
				}
			}
			if run["scaleout"] {
				rep := &benchmark.ScaleoutReport{}
				if command, why := takeoverCommand(); why != "" {
					rep.Skipped = why
				} else {
					url := e.databaseURL
					if url == "" {
						url = e.getenv("DATABASE_URL")
					}
					scaleoutCfg.Command = command
					scaleoutCfg.Env = append(os.Environ(), "DATABASE_URL="+url)
					if rep, err = benchmark.RunScaleout(ctx, pool, scaleoutCfg); err != nil {
						return err
					}
				}
				doc.Scaleout = rep
				if err := report(func(w io.Writer) error { return benchmark.WriteScaleoutTable(w, rep) }); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&only, "only", nil, "benchmarks to run: "+strings.Join(benchmarks, ",")+" (default all)")
	cmd.Flags().BoolVar(&quick, "quick", false, "tiny measurements, for a smoke test")
	cmd.Flags().DurationVar(&duration, "duration", 3*time.Second, "length of each append measurement and of each latency rate")
	cmd.Flags().StringVar(&jsonPath, "json", "", "also write the results as JSON to this file")
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	cmd.Flags().IntSliceVar(&writers, "writers", nil, "append: writer counts (default 1,4,16)")
	cmd.Flags().IntSliceVar(&batches, "batch", nil, "append: events per append (default 1,100)")
	cmd.Flags().IntVar(&appendRounds, "append-rounds", 3, "append: interleaved rounds, each figure their median (quick: 1)")
	cmd.Flags().IntVar(&events, "events", 1_000_000, "catchup: events in the log (quick: 5000)")
	cmd.Flags().IntVar(&rebuildEvents, "rebuild-events", 200_000, "rebuild: events in the log (quick: 5000)")
	cmd.Flags().IntVar(&scaleoutEvents, "scaleout-events", 100_000, "scaleout: events in the log of the throughput runs (quick: 5000)")
	cmd.Flags().IntSliceVar(&rates, "rates", nil, "latency: target appends per second (default 100,1000; quick: 100)")
	cmd.Flags().IntVar(&latencyWriters, "latency-writers", 4, "latency: concurrent writers sharing the load")
	cmd.Flags().IntVar(&rounds, "rounds", 20, "takeover: takeovers after SIGKILL per lock retry interval (quick: 1)")
	cmd.Flags().DurationSliceVar(&lockRetry, "lock-retry", []time.Duration{0},
		"takeover: the standby's LockRetryInterval settings, 0 = the default (20ms)")
	cmd.AddCommand(e.benchChildCommand())
	return cmd
}

// selectBenchmarks returns the benchmarks to run: --only, else those whose
// own flags were given, else all.
func selectBenchmarks(cmd *cobra.Command, only []string) (map[string]bool, error) {
	run := map[string]bool{}
	if cmd.Flags().Changed("only") {
		for _, name := range only {
			name = strings.TrimSpace(name)
			if !slices.Contains(benchmarks, name) {
				return nil, usagef("--only %q: want some of %s", name, strings.Join(benchmarks, ","))
			}
			run[name] = true
		}
		if len(run) == 0 {
			return nil, usagef("--only: name at least one of %s", strings.Join(benchmarks, ","))
		}
		return run, nil
	}
	for name, flags := range benchFlagsOf {
		for _, f := range flags {
			if cmd.Flags().Changed(f) {
				run[name] = true
			}
		}
	}
	if len(run) == 0 {
		for _, name := range benchmarks {
			run[name] = true
		}
	}
	return run, nil
}

// takeoverCommand returns the command line of a takeover child process, or
// why this process cannot start one.
func takeoverCommand() ([]string, string) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Sprintf("cannot locate this executable: %v", err)
	}
	info, ok := debug.ReadBuildInfo()
	if !ok || info.Path != cliMainPackage {
		main := "unknown"
		if ok {
			main = info.Path
		}
		return nil, fmt.Sprintf("this process is %s (main package %s), not the annals command; the benchmark re-executes "+
			"the annals binary as its runner processes (under go test the executable is the test binary). "+
			"Run it from the CLI: go run ./cmd/annals bench --only takeover", filepath.Base(exe), main)
	}
	return []string{exe, "bench", "runner-child"}, ""
}

// writeBenchJSON writes doc to path (nothing when path is empty).
func writeBenchJSON(path string, doc *benchJSON) error {
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return errors.Wrap(err, "write --json")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return errors.Wrap(err, "write --json")
	}
	return errors.Wrap(os.WriteFile(path, append(b, '\n'), 0o644), "write --json")
}
