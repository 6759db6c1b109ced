package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/procstat"
)

// config is the command line.
type config struct {
	DatabaseURL     string
	Prefix          string
	Rounds          int
	Duration        time.Duration
	CatchupEvents   int
	CatchupLimit    time.Duration
	TailDuration    time.Duration
	Hold            time.Duration
	Drain           time.Duration
	TailPoll        time.Duration
	ChildStartDelay time.Duration
	Contenders      []string
	Workloads       []string
	Output          string
	Keep            bool
}

// parseFlags reads the command line into a config.
func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	var contenders, work string
	allWork := []string{}
	for _, w := range workloads {
		allWork = append(allWork, w.Key)
	}
	allWork = append(allWork, "catchup", "tail")
	fs.StringVar(&c.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL)")
	fs.StringVar(&c.Prefix, "prefix", "peers", "schema prefix: each contender works in PREFIX_<name>, dropped at the end")
	fs.IntVar(&c.Rounds, "rounds", 3, "interleaved rounds; figures are medians")
	fs.DurationVar(&c.Duration, "duration", 3*time.Second, "length of each append measurement")
	fs.IntVar(&c.CatchupEvents, "catchup-events", 200_000, "events in the catch-up log")
	fs.DurationVar(&c.CatchupLimit, "catchup-limit", 20*time.Second, "longest catch-up read; a slower reader's rate is taken over what it read")
	fs.DurationVar(&c.TailDuration, "tail-duration", 4*time.Second, "how long the 16 writers append in the correctness check")
	fs.DurationVar(&c.Hold, "hold", 2*time.Second, "how long the unrelated writing transaction stays open in the correctness check")
	fs.DurationVar(&c.Drain, "drain", 3*time.Second, "after the writers stop, how long the tailing reader may go without a new event before the rest count as skipped")
	fs.DurationVar(&c.TailPoll, "tail-poll", 5*time.Millisecond, "poll interval of every tailing reader")
	fs.DurationVar(&c.ChildStartDelay, "child-start", time.Second, "time child processes get to connect before they start together")
	fs.StringVar(&contenders, "contenders", strings.Join(contenderNames, ","), "contenders to run (annals always runs: it is the reference)")
	fs.StringVar(&work, "workloads", strings.Join(allWork, ","), "workloads to run")
	fs.StringVar(&c.Output, "output", "text", "text (markdown tables) or json")
	fs.BoolVar(&c.Keep, "keep", false, "leave the contenders' schemas behind for inspection")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if c.DatabaseURL == "" {
		return nil, errors.New("no database: set DATABASE_URL or -database-url (or run `make bench-peers`)")
	}
	if c.Output != "text" && c.Output != "json" {
		return nil, errors.Newf("-output %q: want text or json", c.Output)
	}
	if c.Rounds < 1 || c.Duration <= 0 || c.CatchupEvents < 1 {
		return nil, errors.New("-rounds, -duration and -catchup-events must be positive")
	}
	c.Contenders = []string{annalsName}
	for _, n := range contenderNames[1:] {
		if slices.Contains(strings.Split(contenders, ","), n) {
			c.Contenders = append(c.Contenders, n)
		}
	}
	for _, n := range strings.Split(contenders, ",") {
		if !slices.Contains(contenderNames, n) {
			return nil, errors.Newf("-contenders: unknown %q (want some of %s)", n, strings.Join(contenderNames, ","))
		}
	}
	for _, w := range strings.Split(work, ",") {
		if !slices.Contains(allWork, w) {
			return nil, errors.Newf("-workloads: unknown %q (want some of %s)", w, strings.Join(allWork, ","))
		}
		c.Workloads = append(c.Workloads, w)
	}
	return c, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	if len(os.Args) > 1 && os.Args[1] == childCommand {
		err = childMain(ctx, os.Args[2:], os.Stdout)
	} else {
		err = run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "peers: %v\n", err)
		os.Exit(1)
	}
}

// openPool connects to DATABASE_URL with room for conns connections.
func openPool(ctx context.Context, conns int) (*pgxpool.Pool, error) {
	return openPoolURL(ctx, os.Getenv("DATABASE_URL"), conns)
}

func openPoolURL(ctx context.Context, url string, conns int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, errors.Wrap(err, "parse the database URL")
	}
	pc.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, errors.Wrap(err, "connect")
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, errors.Wrap(err, "connect")
	}
	return pool, nil
}

// run measures everything cfg asks for and writes the report to stdout;
// progress goes to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	// Children find the database through the environment.
	if err := os.Setenv("DATABASE_URL", cfg.DatabaseURL); err != nil {
		return err
	}
	start := time.Now()
	rep, err := measure(ctx, cfg, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "peers: done in %s\n", time.Since(start).Round(time.Second))
	if cfg.Output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return writeText(stdout, rep)
}

// measure runs the workloads and returns the report.
func measure(ctx context.Context, cfg *config, progress io.Writer) (*report, error) {
	pool, err := openPoolURL(ctx, cfg.DatabaseURL, 24)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	rep := &report{Rounds: cfg.Rounds, Duration: cfg.Duration.String(), Contenders: cfg.Contenders, CatchupLimit: cfg.CatchupLimit.String()}
	if err := pool.QueryRow(ctx, query("Settings", "")).Scan(&rep.Server, &rep.Fsync, &rep.SynchronousCommit); err != nil {
		return nil, errors.Wrap(err, "read server settings")
	}
	rep.LoadBefore = loadAverage()
	defer func() { rep.LoadAfter = loadAverage() }()
	fmt.Fprintf(progress, "peers: PostgreSQL %s, fsync=%s, synchronous_commit=%s, load average %s\n", rep.Server, rep.Fsync, rep.SynchronousCommit, rep.LoadBefore)
	byName := map[string]*contender{}
	var all []*contender
	for _, n := range cfg.Contenders {
		c, err := newContender(pool, cfg.Prefix, n)
		if err != nil {
			return nil, err
		}
		byName[n] = c
		all = append(all, c)
	}
	unrelated := cfg.Prefix + "_unrelated"
	defer func() {
		if cfg.Keep {
			return
		}
		dctx := context.WithoutCancel(ctx)
		for _, c := range all {
			_ = c.drop(dctx)
		}
		_, _ = pool.Exec(dctx, query("DropSchema", unrelated))
	}()
	if err := warm(ctx, pool, 17); err != nil {
		return nil, err
	}
	server, why := procstat.FindServer(ctx, pool)
	rep.ServerCPUNote = why

	// Appends: every round runs every workload for every contender, in an
	// order that rotates, each on an empty schema.
	var ws []workload
	for _, w := range workloads {
		if slices.Contains(cfg.Workloads, w.Key) {
			ws = append(ws, w)
			rep.Appends = append(rep.Appends, &row{Workload: w.Key, Label: w.Label, Unit: "events/s"})
		}
	}
	for round := range cfg.Rounds {
		for wi, w := range ws {
			for _, c := range rotate(all, round+wi) {
				if err := c.reset(ctx); err != nil {
					return nil, err
				}
				rate, cpu, err := measureAppend(ctx, cfg, server, c, w, fmt.Sprintf("r%d", round), progress)
				if err != nil {
					return nil, errors.Wrapf(err, "%s, %s", w.Label, c.name)
				}
				fmt.Fprintf(progress, "round %d/%d, %s, %s: %.0f events/s\n", round+1, cfg.Rounds, w.Label, c.name, rate)
				rep.Appends[wi].add(c.name, rate, false)
				rep.Appends[wi].addCPU(c.name, cpu)
			}
		}
	}

	if slices.Contains(cfg.Workloads, "catchup") {
		rep.Catchup = &row{Workload: "catchup", Label: fmt.Sprintf("catch-up of %s events, no-op consumer", thousands(float64(cfg.CatchupEvents))), Unit: "events/s"}
		var cs []*contender
		for _, n := range catchupContenders {
			if c := byName[n]; c != nil {
				start := time.Now()
				if err := fill(ctx, c, cfg.CatchupEvents); err != nil {
					return nil, err
				}
				fmt.Fprintf(progress, "catch-up: filled %s with %d events in %.1fs\n", c.name, cfg.CatchupEvents, time.Since(start).Seconds())
				cs = append(cs, c)
			}
		}
		for round := range cfg.Rounds {
			for _, c := range rotate(cs, round) {
				start := time.Now()
				n, err := c.readAll(ctx, round, cfg.CatchupEvents, cfg.CatchupLimit)
				elapsed := time.Since(start)
				if err != nil {
					return nil, errors.Wrapf(err, "catch-up, %s", c.name)
				}
				if n > cfg.CatchupEvents || (n < cfg.CatchupEvents && elapsed < cfg.CatchupLimit) {
					return nil, errors.Newf("catch-up, %s: read %d events of %d", c.name, n, cfg.CatchupEvents)
				}
				rate := float64(n) / elapsed.Seconds()
				fmt.Fprintf(progress, "round %d/%d, catch-up, %s: %d events in %.2fs, %.0f events/s\n", round+1, cfg.Rounds, c.name, n, elapsed.Seconds(), rate)
				rep.Catchup.add(c.name, rate, n < cfg.CatchupEvents)
			}
		}
	}

	if slices.Contains(cfg.Workloads, "tail") {
		if _, err := pool.Exec(ctx, query("DropSchema", unrelated)); err != nil {
			return nil, errors.Wrap(err, "drop the unrelated schema")
		}
		if _, err := pool.Exec(ctx, query("CreateSchema", unrelated)+query("UnrelatedSetup", unrelated)); err != nil {
			return nil, errors.Wrap(err, "create the unrelated table")
		}
		rep.Tail = &tailReport{Writers: 16, Duration: cfg.TailDuration.String(), Hold: cfg.Hold.String(), Drain: cfg.Drain.String(), Poll: cfg.TailPoll.String(), Results: map[string]*tailResult{}, Held: map[string]*tailResult{}}
		for _, c := range all {
			for _, hold := range []time.Duration{0, cfg.Hold} {
				r, err := tailCheck(ctx, cfg, c, unrelated, hold)
				if err != nil {
					return nil, errors.Wrapf(err, "tailing check, %s", c.name)
				}
				fmt.Fprintf(progress, "tailing check, unrelated transaction held %s, %s\n", hold, describeTail(c.name, r))
				if hold == 0 {
					rep.Tail.Results[c.name] = r
				} else {
					rep.Tail.Held[c.name] = r
				}
			}
		}
	}
	rep.finish()
	return rep, nil
}

// loadAverage returns the machine's 1-, 5- and 15-minute load averages
// (Linux), or "" where they cannot be read: the figures of a busy machine
// are noisier.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// rotate returns s rotated left by k.
func rotate[T any](s []T, k int) []T {
	if len(s) == 0 {
		return nil
	}
	k %= len(s)
	return append(slices.Clone(s[k:]), s[:k]...)
}
