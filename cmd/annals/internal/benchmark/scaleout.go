package benchmark

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
)

// ScaleoutConfig configures RunScaleout. A nil *ScaleoutConfig means
// defaults, except for Command, which is required.
type ScaleoutConfig struct {
	// Schema is the schema the benchmark drops, recreates and leaves behind.
	// Defaults to "annals_bench_scaleout".
	Schema string
	// Command and Env are the child processes' command line and
	// environment, as in TakeoverConfig. Command is required.
	Command []string
	Env     []string
	// Partitions is the subscriber's number of partitions. Defaults to 16.
	Partitions int
	// Rounds is the number of joins and of SIGKILLs measured. Defaults to 10.
	Rounds int
	// Events is the size of the log the throughput runs catch up on.
	// Defaults to 100,000.
	Events int
	// Processes lists the process counts of the throughput runs. Defaults
	// to 1, 2, 4.
	Processes []int
	// Progress receives a line as each measurement starts. Defaults to none.
	Progress io.Writer
}

// ScaleoutThroughput is one throughput run.
type ScaleoutThroughput struct {
	Processes    int     `json:"processes"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	// VsOne is EventsPerSec over the one-process run's.
	VsOne float64 `json:"vs_one_process"`
}

// ScaleoutReport is the outcome of RunScaleout.
type ScaleoutReport struct {
	Skipped    string `json:"skipped,omitempty"`
	Partitions int    `json:"partitions,omitempty"`
	// Join: from a 4th process's start (ready) until the 4 processes lead
	// 4 partitions each (3 → 4 processes).
	Join *TakeoverStats `json:"join,omitempty"`
	// Kill: from the SIGKILL of one of 4 processes until its partitions
	// are claimed by the 3 others.
	Kill       *TakeoverStats       `json:"kill,omitempty"`
	Events     int                  `json:"events,omitempty"`
	Throughput []ScaleoutThroughput `json:"throughput,omitempty"`
}

func (c *ScaleoutConfig) withDefaults() ScaleoutConfig {
	var out ScaleoutConfig
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = "annals_bench_scaleout"
	}
	if out.Env == nil {
		out.Env = os.Environ()
	}
	if out.Partitions <= 0 {
		out.Partitions = 16
	}
	if out.Rounds <= 0 {
		out.Rounds = 10
	}
	if out.Events <= 0 {
		out.Events = 100_000
	}
	if len(out.Processes) == 0 {
		out.Processes = []int{1, 2, 4}
	}
	if out.Progress == nil {
		out.Progress = io.Discard
	}
	return out
}

// RunScaleout measures balanced leadership with child runner processes:
// how soon a 4th process gets its share of Partitions, how soon the
// partitions of a SIGKILLed one of 4 are led again, and the catch-up
// throughput of one subscriber with a per-event upsert handler run by 1, 2
// and 4 processes.
func RunScaleout(ctx context.Context, pool *pgxpool.Pool, cfg *ScaleoutConfig) (*ScaleoutReport, error) {
	c := cfg.withDefaults()
	if len(c.Command) == 0 {
		return nil, errors.New("benchmark: scale-out needs the child command")
	}
	q, err := freshSchema(ctx, pool, c.Schema)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (stream_id text PRIMARY KEY, events bigint NOT NULL, last_position bigint NOT NULL, updated_at timestamptz NOT NULL)`,
		pgx.Identifier{c.Schema, "bench_scale_rm"}.Sanitize())); err != nil {
		return nil, errors.Wrap(err, "benchmark: create the read model")
	}
	tc := TakeoverConfig{Schema: c.Schema, Command: c.Command, Env: c.Env}
	s := &scaleout{c: c, tc: tc, pool: pool}
	defer s.stopAll()
	rep := &ScaleoutReport{Partitions: c.Partitions, Events: c.Events}

	fmt.Fprintf(c.Progress, "scale-out: joins (3 → 4 processes, %d partitions), %d round(s) ...\n", c.Partitions, c.Rounds)
	joins, kills, err := s.joinsAndKills(ctx)
	if err != nil {
		return nil, err
	}
	j, k := takeoverStats(joins), takeoverStats(kills)
	rep.Join, rep.Kill = &j, &k
	s.stopAll()

	fmt.Fprintf(c.Progress, "scale-out: fill the log with %d events ...\n", c.Events)
	if err := fill(ctx, pool, q["Fill"], CatchupConfig{Events: c.Events, FillBatch: 50, Progress: c.Progress}); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, q["Vacuum"]); err != nil {
		return nil, errors.Wrap(err, "benchmark: vacuum the events table")
	}
	var head int64
	if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT coalesce(max(global_sequence), 0) FROM %s", pgx.Identifier{c.Schema, "events"}.Sanitize())).Scan(&head); err != nil {
		return nil, errors.Wrap(err, "benchmark: read the head")
	}
	for _, n := range c.Processes {
		fmt.Fprintf(c.Progress, "scale-out: catch-up of %d events by %d process(es) ...\n", c.Events, n)
		d, err := s.throughput(ctx, n, head)
		if err != nil {
			return nil, err
		}
		t := ScaleoutThroughput{Processes: n, Seconds: d.Seconds(), EventsPerSec: float64(c.Events) / d.Seconds()}
		if len(rep.Throughput) > 0 {
			t.VsOne = ratio(t.EventsPerSec, rep.Throughput[0].EventsPerSec)
		} else {
			t.VsOne = 1
		}
		rep.Throughput = append(rep.Throughput, t)
		fmt.Fprintf(c.Progress, "scale-out: %d process(es): %.0f events/s\n", n, t.EventsPerSec)
	}
	return rep, nil
}

type scaleout struct {
	c        ScaleoutConfig
	tc       TakeoverConfig
	pool     *pgxpool.Pool
	children []*child
	n        int
}

func (s *scaleout) start(ctx context.Context, sub string, upsert bool) (*child, error) {
	s.n++
	ch, err := startChild(ctx, s.tc, ChildConfig{Schema: s.c.Schema, InstanceID: fmt.Sprintf("%s-%d", sub, s.n), Subscriber: sub,
		Partitions: s.c.Partitions, Upsert: upsert})
	if err == nil {
		s.children = append(s.children, ch)
	}
	return ch, err
}

func (s *scaleout) stopAll() {
	for _, ch := range s.children {
		ch.stop()
	}
	s.children = nil
}

// owners returns each partition's checkpoint owner, epoch and position.
func (s *scaleout) owners(ctx context.Context, sub string) ([]string, []int64, []int64, error) {
	own, ep, pos := make([]string, s.c.Partitions), make([]int64, s.c.Partitions), make([]int64, s.c.Partitions)
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT partition, coalesce(owner, ''), epoch, position FROM %s WHERE subscriber_id = $1`,
		pgx.Identifier{s.c.Schema, "checkpoints"}.Sanitize()), sub)
	if err != nil {
		return nil, nil, nil, errors.Wrap(err, "benchmark: read the checkpoints")
	}
	var p int
	var o string
	var e, x int64
	_, err = pgx.ForEachRow(rows, []any{&p, &o, &e, &x}, func() error {
		if p < s.c.Partitions {
			own[p], ep[p], pos[p] = o, e, x
		}
		return nil
	})
	return own, ep, pos, errors.Wrap(err, "benchmark: read the checkpoints")
}

// waitUntil polls the owners every 2 ms until cond holds, and returns when.
func (s *scaleout) waitUntil(ctx context.Context, sub string, what string, cond func(own []string, ep, pos []int64) bool) (time.Time, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		own, ep, pos, err := s.owners(ctx, sub)
		now := time.Now()
		if err != nil {
			return now, err
		}
		if cond(own, ep, pos) {
			return now, nil
		}
		if now.After(deadline) {
			return now, errors.Newf("benchmark: %s: not within 60s (owners %v)", what, own)
		}
		if err := sleep(ctx, 2*time.Millisecond); err != nil {
			return now, err
		}
	}
}

// balancedOver reports whether live lead every partition, each ⌊P/N⌋ or ⌈P/N⌉.
func balancedOver(live []*child, parts int) func([]string, []int64, []int64) bool {
	return func(own []string, _, _ []int64) bool {
		n := map[string]int{}
		for _, o := range own {
			if !slices.ContainsFunc(live, func(c *child) bool { return c.id == o }) {
				return false
			}
			n[o]++
		}
		lo, hi := parts/len(live), (parts+len(live)-1)/len(live)
		for _, c := range live {
			if n[c.id] < lo || n[c.id] > hi {
				return false
			}
		}
		return true
	}
}

// joinsAndKills measures Rounds joins of a 4th process and Rounds SIGKILLs
// of one of 4.
func (s *scaleout) joinsAndKills(ctx context.Context) (joins, kills []time.Duration, err error) {
	const sub = "bench-scale"
	var live []*child
	for range 3 {
		ch, err := s.start(ctx, sub, false)
		if err != nil {
			return nil, nil, err
		}
		live = append(live, ch)
	}
	if _, err := s.waitUntil(ctx, sub, "3 processes balanced", balancedOver(live, s.c.Partitions)); err != nil {
		return nil, nil, err
	}
	for r := range s.c.Rounds {
		fourth, err := s.start(ctx, sub, false)
		if err != nil {
			return nil, nil, err
		}
		ready := time.Now()
		four := append(slices.Clone(live), fourth)
		at, err := s.waitUntil(ctx, sub, "a 4th process's share", balancedOver(four, s.c.Partitions))
		if err != nil {
			return nil, nil, err
		}
		joins = append(joins, at.Sub(ready))
		fmt.Fprintf(s.c.Progress, "scale-out: join %d/%d: share after %.1f ms\n", r+1, s.c.Rounds, ms(at.Sub(ready)))
		// SIGKILL one of the four (the oldest, which leads partitions since
		// the start) and time the claims of its partitions.
		victim := four[0]
		_, before, _, err := s.owners(ctx, sub)
		if err != nil {
			return nil, nil, err
		}
		own, _, _, _ := s.owners(ctx, sub)
		var its []int
		for p, o := range own {
			if o == victim.id {
				its = append(its, p)
			}
		}
		killed := time.Now()
		if err := victim.cmd.Process.Kill(); err != nil {
			return nil, nil, errors.Wrap(err, "benchmark: SIGKILL")
		}
		at, err = s.waitUntil(ctx, sub, "the killed process's partitions led again", func(own []string, ep, _ []int64) bool {
			for _, p := range its {
				if own[p] == victim.id || ep[p] <= before[p] {
					return false
				}
			}
			return true
		})
		if err != nil {
			return nil, nil, err
		}
		kills = append(kills, at.Sub(killed))
		fmt.Fprintf(s.c.Progress, "scale-out: kill %d/%d: %d partitions led again after %.1f ms\n", r+1, s.c.Rounds, len(its), ms(at.Sub(killed)))
		<-victim.exited
		live = four[1:]
		if _, err := s.waitUntil(ctx, sub, "3 processes balanced", balancedOver(live, s.c.Partitions)); err != nil {
			return nil, nil, err
		}
	}
	return joins, kills, nil
}

// throughput runs n processes of a new upsert subscriber from the start of
// the log and returns the time from the first one's start until every
// partition's checkpoint is at head.
func (s *scaleout) throughput(ctx context.Context, n int, head int64) (time.Duration, error) {
	defer s.stopAll()
	sub := fmt.Sprintf("bench-scale-upsert-%d", n)
	if _, err := s.pool.Exec(ctx, fmt.Sprintf("TRUNCATE %s", pgx.Identifier{s.c.Schema, "bench_scale_rm"}.Sanitize())); err != nil {
		return 0, errors.Wrap(err, "benchmark: truncate the read model")
	}
	var start time.Time
	for i := range n {
		if _, err := s.start(ctx, sub, true); err != nil {
			return 0, err
		}
		if i == 0 {
			start = time.Now()
		}
	}
	at, err := s.waitUntil(ctx, sub, "caught up", func(own []string, _, pos []int64) bool {
		for p := range own {
			if pos[p] != head {
				return false
			}
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	var rows int64
	if err := s.pool.QueryRow(ctx, fmt.Sprintf("SELECT coalesce(sum(events), 0) FROM %s", pgx.Identifier{s.c.Schema, "bench_scale_rm"}.Sanitize())).Scan(&rows); err != nil {
		return 0, errors.Wrap(err, "benchmark: read the read model")
	}
	if rows != int64(s.c.Events) {
		return 0, errors.Newf("benchmark: the read model counts %d events, want %d", rows, s.c.Events)
	}
	return at.Sub(start), nil
}

// upsertProjection upserts one read-model row per stream for each event:
// a realistic per-event cost (an index lookup and a row write).
type upsertProjection struct {
	name, table string
}

func (p *upsertProjection) Name() string { return p.name }

func (p *upsertProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+p.table+` AS t (stream_id, events, last_position, updated_at) VALUES ($1, 1, $2, now())
		ON CONFLICT (stream_id) DO UPDATE SET events = t.events + 1, last_position = EXCLUDED.last_position, updated_at = now()`,
		e.StreamID, e.GlobalSequence)
	return err
}

// WriteScaleoutTable prints rep.
func WriteScaleoutTable(w io.Writer, rep *ScaleoutReport) error {
	if rep.Skipped != "" {
		_, err := fmt.Fprintf(w, "scale-out: skipped: %s\n", rep.Skipped)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "SCALE-OUT (%d partitions)\tMEDIAN\tMAX\n", rep.Partitions)
	if rep.Join != nil {
		fmt.Fprintf(tw, "a 4th process gets its share (3 → 4)\t%.1f ms\t%.1f ms\n", rep.Join.Median, rep.Join.Max)
	}
	if rep.Kill != nil {
		fmt.Fprintf(tw, "SIGKILLed process's partitions led again\t%.1f ms\t%.1f ms\n", rep.Kill.Median, rep.Kill.Max)
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "CATCH-UP, %d events, upsert per event\tEVENTS/S\tVS 1 PROCESS\n", rep.Events)
	for _, t := range rep.Throughput {
		fmt.Fprintf(tw, "%d process(es)\t%.0f\t%.2f×\n", t.Processes, t.EventsPerSec, t.VsOne)
	}
	return tw.Flush()
}
