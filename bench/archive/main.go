package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/archive"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func main() {
	events := flag.Int64("events", 10_000_000, "events in the log")
	catchup := flag.Int64("catchup", 1_000_000, "events a catch-up reads")
	dur := flag.Duration("duration", 5*time.Second, "duration of each append measurement")
	batch := flag.Int("batch", 10000, "archive: positions per step")
	flag.Parse()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	b := &bench{pool: pool, dur: *dur}
	var fsync string
	must(pool.QueryRow(ctx, `SELECT current_setting('fsync')`).Scan(&fsync))
	fmt.Printf("fsync=%s, %d events, catch-up of %d, append runs of %s, archive batch %d\n", fsync, *events, *catchup, *dur, *batch)

	t0 := time.Now()
	must(b.load(ctx, *events))
	fmt.Printf("load (fast path): %.1f s\n", time.Since(t0).Seconds())
	must(b.exec(ctx, `VACUUM (ANALYZE) annals.events`))
	b.sizes(ctx, "before archiving")
	b.measure(ctx, "before", *catchup)

	a, err := archive.New(pool, &archive.Config{BatchSize: *batch, Pause: -1, Logger: quiet})
	must(err)
	var head int64
	must(pool.QueryRow(ctx, `SELECT max(global_sequence) FROM annals.events`).Scan(&head))
	before := head * 9 / 10
	t0 = time.Now()
	p, err := a.RunOnce(ctx, before)
	must(err)
	d := time.Since(t0)
	fmt.Printf("archive: %d events moved in %d steps, %.1f s (%.0f events/s)\n", p.Moved, p.Steps, d.Seconds(), float64(p.Moved)/d.Seconds())
	t0 = time.Now()
	must(b.exec(ctx, `VACUUM (ANALYZE) annals.events`))
	must(b.exec(ctx, `VACUUM (ANALYZE) annals.events_archive`))
	fmt.Printf("vacuum: %.1f s\n", time.Since(t0).Seconds())
	b.sizes(ctx, "after archiving and VACUUM")
	b.measure(ctx, "after", *catchup)
	// Catch-up straddling the horizon: from horizon - catchup to the head.
	n, rate := b.catchUp(ctx, "straddle", before-1-*catchup)
	fmt.Printf("after: catch-up of %d events from %d archived ones on (through the archive query): %.0f events/s\n", n, *catchup, rate)
	// Plain VACUUM leaves the hot table's file as large as before (its
	// space is reused by new appends, out of position order); VACUUM FULL
	// rewrites it (appends wait meanwhile).
	t0 = time.Now()
	must(b.exec(ctx, `VACUUM (FULL, ANALYZE) annals.events`))
	fmt.Printf("VACUUM FULL of the hot table: %.1f s\n", time.Since(t0).Seconds())
	b.sizes(ctx, "after VACUUM FULL of the hot table")
	b.measure(ctx, "after VACUUM FULL", *catchup)
}

type bench struct {
	pool *pgxpool.Pool
	dur  time.Duration
	runs int
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

func (b *bench) exec(ctx context.Context, sql string, args ...any) error {
	_, err := b.pool.Exec(ctx, sql, args...)
	return err
}

// load fills the log with n events over 10,000 streams, in chunks of 1M.
func (b *bench) load(ctx context.Context, n int64) error {
	const streams = 10000
	for from := int64(1); from <= n; from += 1_000_000 {
		to := min(n, from+999_999)
		if err := b.exec(ctx, `
			INSERT INTO annals.events (global_sequence, event_id, stream_id, stream_version, event_type, data, recorded_at)
			SELECT g, gen_random_uuid(), 'acct-' || (g % $3), (g - 1) / $3 + 1, 'acct.deposited',
			       json_build_object('amount', g % 1000, 'note', 'benchmark deposit'), clock_timestamp()
			  FROM generate_series($1::bigint, $2::bigint) g`, from, to, streams); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "loaded %d\n", to)
	}
	if err := b.exec(ctx, `INSERT INTO annals.streams (stream_id, version)
		SELECT stream_id, max(stream_version) FROM annals.events GROUP BY stream_id`); err != nil {
		return err
	}
	return b.exec(ctx, `SELECT setval('annals.events_global_sequence', $1)`, n)
}

func (b *bench) sizes(ctx context.Context, when string) {
	rows, err := b.pool.Query(ctx, `
		SELECT c.relname, pg_relation_size(c.oid), pg_indexes_size(c.oid), pg_total_relation_size(c.oid),
		       (SELECT count(*) FROM annals.events_archive WHERE c.relname = 'events_archive') +
		       (SELECT count(*) FROM annals.events WHERE c.relname = 'events')
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname = 'annals' AND c.relname IN ('events', 'events_archive') ORDER BY 1`)
	must(err)
	fmt.Printf("sizes %s:\n", when)
	var name string
	var heap, idx, total, count int64
	_, err = pgx.ForEachRow(rows, []any{&name, &heap, &idx, &total, &count}, func() error {
		fmt.Printf("  %-15s %10d rows  heap %7.0f MiB  indexes %7.0f MiB  total %7.0f MiB\n", name, count,
			float64(heap)/(1<<20), float64(idx)/(1<<20), float64(total)/(1<<20))
		return nil
	})
	must(err)
}

func (b *bench) measure(ctx context.Context, when string, catchup int64) {
	store, err := eventstore.New(b.pool, nil)
	must(err)
	for _, c := range []struct {
		writers, per int
		ids          bool
	}{{16, 1, false}, {16, 1, true}, {4, 100, false}} {
		rate, lat := b.appendRate(ctx, store, c.writers, c.per, c.ids)
		ids := ""
		if c.ids {
			ids = ", caller-chosen IDs (looked up in both tables)"
		}
		fmt.Printf("%s: append %d writers x %d events%s: %.0f events/s, p50 %.2f ms, p99 %.2f ms\n", when, c.writers, c.per, ids, rate, lat[0], lat[1])
	}
	var head int64
	must(b.pool.QueryRow(ctx, `SELECT max(global_sequence) FROM annals.events`).Scan(&head))
	n, rate := b.catchUp(ctx, when, head-catchup)
	fmt.Printf("%s: catch-up of the last %d events (no-op projection, 500 per batch): %.0f events/s\n", when, n, rate)
	p50, p99, got := b.tail(ctx, store)
	fmt.Printf("%s: live tail at 500 appends/s for 3 s: %d delivered, latency p50 %.2f ms, p99 %.2f ms\n", when, got, p50, p99)
}

// appendRate runs writers appending per events each (each writer its own
// streams) for b.dur; returns events/s and the p50, p99 append latency.
func (b *bench) appendRate(ctx context.Context, store *eventstore.Store, writers, per int, ids bool) (float64, [2]float64) {
	b.runs++
	run := b.runs
	cctx, cancel := context.WithTimeout(ctx, b.dur)
	defer cancel()
	var total atomic.Int64
	var mu sync.Mutex
	var lats []float64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			evs := make([]eventstore.EventData, per)
			var mine []float64
			for i := 0; cctx.Err() == nil; i++ {
				for j := range evs {
					evs[j] = eventstore.EventData{Type: "acct.deposited", Data: map[string]any{"amount": i, "note": "benchmark deposit"}}
					if ids {
						evs[j].ID = uuid.New()
					}
				}
				t := time.Now()
				if _, err := store.Append(ctx, fmt.Sprintf("w%d-%d-%d", run, w, i%100), eventstore.Any, evs...); err != nil {
					log.Fatal(err)
				}
				mine = append(mine, float64(time.Since(t).Microseconds())/1000)
				total.Add(int64(per))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(lats)
	return float64(total.Load()) / time.Since(start).Seconds(), [2]float64{pct(lats, 0.5), pct(lats, 0.99)}
}

func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[int(float64(len(xs)-1)*p)]
}

type noop struct {
	name string
	n    atomic.Int64
}

func (p *noop) Name() string { return p.name }
func (p *noop) Handle(context.Context, pgx.Tx, eventstore.Event) error {
	p.n.Add(1)
	return nil
}

// catchUp runs a no-op projection from position from to the head.
func (b *bench) catchUp(ctx context.Context, name string, from int64) (int64, float64) {
	sub := "bench-archive-" + name
	must(b.exec(ctx, `INSERT INTO annals.checkpoints (subscriber_id, partition, position) VALUES ($1, 0, $2)
		ON CONFLICT (subscriber_id, partition) DO UPDATE SET position = $2`, sub, max(from, 0)))
	r, err := projection.NewRunner(b.pool, &projection.Config{Logger: quiet})
	must(err)
	p := &noop{name: sub}
	must(r.Register(p, nil))
	t := time.Now()
	must(r.RunUntilCaughtUp(ctx))
	d := time.Since(t)
	return p.n.Load(), float64(p.n.Load()) / d.Seconds()
}

type tailObserver struct {
	mu   sync.Mutex
	lats []float64
	seen atomic.Int64
}

func (o *tailObserver) Name() string { return "bench-archive-tail" }
func (o *tailObserver) Handle(_ context.Context, e eventstore.Event) error {
	o.mu.Lock()
	o.lats = append(o.lats, float64(time.Since(e.RecordedAt).Microseconds())/1000)
	o.mu.Unlock()
	o.seen.Add(1)
	return nil
}

// tail appends 500 events/s for 3 s while an observer tails the log, and
// returns the delivery latency (append's recorded_at to Handle).
func (b *bench) tail(ctx context.Context, store *eventstore.Store) (float64, float64, int64) {
	var head int64
	must(b.pool.QueryRow(ctx, `SELECT max(global_sequence) FROM annals.events`).Scan(&head))
	must(b.exec(ctx, `INSERT INTO annals.checkpoints (subscriber_id, partition, position) VALUES ('bench-archive-tail', 0, $1)
		ON CONFLICT (subscriber_id, partition) DO UPDATE SET position = $1`, head))
	r, err := projection.NewRunner(b.pool, &projection.Config{Logger: quiet})
	must(err)
	o := &tailObserver{}
	must(r.Register(o, nil))
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	time.Sleep(time.Second) // the runner takes its lock and catches up (nothing to read)
	tick := time.NewTicker(2 * time.Millisecond)
	sent := 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); sent++ {
		<-tick.C
		if _, err := store.Append(ctx, "tail", eventstore.Any, eventstore.EventData{Type: "tick", Data: map[string]int{"i": sent}}); err != nil {
			log.Fatal(err)
		}
	}
	tick.Stop()
	for deadline := time.Now().Add(10 * time.Second); o.seen.Load() < int64(sent) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	must(<-done)
	o.mu.Lock()
	defer o.mu.Unlock()
	slices.Sort(o.lats)
	return pct(o.lats, 0.5), pct(o.lats, 0.99), o.seen.Load()
}
