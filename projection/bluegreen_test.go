package projection_test

// Tests of blue/green read models: a reader querying the stable views while
// a new generation is replayed and cut over never sees a partial or mixed
// read model; rollback; deploy-driven rebuilds; bad input. The SIGKILL tests
// are in bluegreen_kill_test.go.

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// Counted is the event of the blue/green tests: the V-th event of its stream
// carries V.
type Counted struct {
	V int64 `json:"v"`
}

const bgName = "bgstats"

// bgBonus is what version 2 adds per event to total, so that every row says
// which version wrote it: version 1 keeps total = n(n+1)/2, version 2
// n(n+1)/2 + 1000n.
const bgBonus = 1000

// statsProjection keeps, per stream, the number of events (n) and the sum of
// their values (total), in table stats, which it creates in its setup.
func statsProjection(version int) *projection.Typed {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Counted](reg, "bg.counted")
	p := projection.New(bgName, reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE stats (stream text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)`))
	bonus := int64(0)
	if version >= 2 {
		bonus = bgBonus
	}
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Counted]) error {
		_, err := tx.Exec(ctx, `INSERT INTO stats VALUES ($1, 1, $2)
			ON CONFLICT (stream) DO UPDATE SET n = stats.n + 1, total = stats.total + $2`, e.StreamID, e.Data.V+bonus)
		return err
	})
	return p
}

// bgLog is the log of the blue/green tests: streams s000000, s000001, …,
// each appended whole by one call, one after the other, so that the log's
// state at any position is a prefix: streams before some k complete, k
// partly there, none after.
type bgLog struct {
	db   *annalstest.DB
	mu   sync.Mutex
	lens []int // events per stream, by index, recorded before its append
}

func streamName(i int) string { return fmt.Sprintf("s%06d", i) }

// add appends streams streams of per events each, one call per stream.
func (l *bgLog) add(ctx context.Context, streams, per int) error {
	q := `SELECT count(*) FROM ` + pgx.Identifier{l.db.Schema}.Sanitize() + `.append_events($1, 0,
		(SELECT jsonb_agg(jsonb_build_object('type', 'bg.counted', 'data', jsonb_build_object('v', i)) ORDER BY i)
		   FROM generate_series(1, $2::int) i))`
	for range streams {
		l.mu.Lock()
		i := len(l.lens)
		l.lens = append(l.lens, per)
		l.mu.Unlock()
		var n int
		if err := l.db.Pool.QueryRow(ctx, q, streamName(i), per).Scan(&n); err != nil {
			return errors.Wrapf(err, "append stream %d", i)
		}
	}
	return nil
}

func (l *bgLog) lengths() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lens)
}

type statRow struct {
	n, total int64
}

// readStats reads a stats table or view (a qualified name) in one statement.
func readStats(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, table string) (map[string]statRow, error) {
	rows, err := db.Query(ctx, `SELECT stream, n, total FROM `+table)
	if err != nil {
		return nil, err
	}
	out := map[string]statRow{}
	var s string
	var r statRow
	_, err = pgx.ForEachRow(rows, []any{&s, &r.n, &r.total}, func() error { out[s] = r; return nil })
	return out, err
}

// verdict checks that m is the read model of one version at some position of
// the log: every row written by the same version, and the counts a prefix
// of the log. It returns the version (0 for an empty model) and the number
// of events the model holds.
func verdict(m map[string]statRow, lens []int) (version int, events int64, err error) {
	for s, r := range m {
		base := r.n * (r.n + 1) / 2
		v := 0
		switch r.total {
		case base:
			v = 1
		case base + bgBonus*r.n:
			v = 2
		default:
			return 0, 0, errors.Newf("stream %s: n %d, total %d: written by no version", s, r.n, r.total)
		}
		if version != 0 && v != version {
			return 0, 0, errors.Newf("mixed versions: stream %s is version %d, others %d", s, v, version)
		}
		version = v
		events += r.n
	}
	names := make([]string, 0, len(m))
	for s := range m {
		names = append(names, s)
	}
	sort.Strings(names)
	partial := false
	for i, l := range lens {
		r, ok := m[streamName(i)]
		switch {
		case partial && ok:
			return 0, 0, errors.Newf("stream %d is there after a stream not complete: not a prefix of the log", i)
		case !ok || r.n < int64(l):
			partial = true
		case r.n > int64(l):
			return 0, 0, errors.Newf("stream %d has %d events, more than the %d appended", i, r.n, l)
		}
	}
	if len(m) > 0 {
		if last, _ := strconv.Atoi(strings.TrimPrefix(names[len(names)-1], "s")); last >= len(lens) {
			return 0, 0, errors.Newf("stream %s was never appended", names[len(names)-1])
		}
	}
	return version, events, nil
}

// exactAt checks that a generation's table holds exactly the log through its
// checkpoint, each event applied once, by the given version.
func exactAt(t *testing.T, db *annalstest.DB, table, subscriber string, version int) int64 {
	t.Helper()
	ctx := t.Context()
	var pos int64
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(max(position), 0) FROM `+pgx.Identifier{db.Schema}.Sanitize()+
		`.checkpoints WHERE subscriber_id = $1`, subscriber).Scan(&pos); err != nil {
		t.Fatal(err)
	}
	got, err := readStats(ctx, db.Pool, table)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT stream_id, count(*), sum((data->>'v')::bigint) FROM `+
		pgx.Identifier{db.Schema}.Sanitize()+`.events WHERE global_sequence <= $1 GROUP BY stream_id`, pos)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]statRow{}
	var s string
	var r statRow
	if _, err := pgx.ForEachRow(rows, []any{&s, &r.n, &r.total}, func() error {
		if version >= 2 {
			r.total += bgBonus * r.n
		}
		want[s] = r
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%s at position %d: %d streams, want %d", table, pos, len(got), len(want))
	}
	for s, w := range want {
		if got[s] != w {
			t.Fatalf("%s at position %d: stream %s is %+v, want %+v (each event applied exactly once by version %d)", table, pos, s, got[s], w, version)
		}
	}
	return pos
}

func bgRunner(t *testing.T, db *annalstest.DB, id string, version int, auto bool) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(db.Pool, &projection.Config{
		InstanceID: id, PollInterval: 100 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(statsProjection(version), &projection.Options{BlueGreen: &projection.BlueGreen{
		Version: version, AutoRebuild: auto, CheckInterval: 100 * time.Millisecond,
	}}); err != nil {
		t.Fatal(err)
	}
	return r
}

// bgRunInBackground runs r until the test ends (or stop is called).
func bgRunInBackground(t *testing.T, r *projection.Runner) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func generation(t *testing.T, db *annalstest.DB, gen int) projection.Generation {
	t.Helper()
	gens, err := projection.ListGenerations(t.Context(), db.Pool, db.Schema, bgName)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gens {
		if g.Generation == gen {
			return g
		}
	}
	t.Fatalf("no generation %d in %+v", gen, gens)
	return projection.Generation{}
}

func state(t *testing.T, db *annalstest.DB, gen int) projection.GenerationState {
	t.Helper()
	gens, err := projection.ListGenerations(t.Context(), db.Pool, db.Schema, bgName)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gens {
		if g.Generation == gen {
			return g.State
		}
	}
	return ""
}

// TestBlueGreenReaderNeverSeesPartialState rebuilds a read model of 50,000
// events blue/green while the old version keeps following live appends and
// a reader queries the stable view in a loop: every answer is the complete
// model of one version at some position of the log, positions never go
// back, and after the cut-over the reader sees version 2. Then a rollback
// brings version 1 back, caught up by its runner.
//
// Not parallel: it bounds the cut-over's swap (500 ms), which beside other
// tests of the package on a loaded 2-core machine took 700 ms.
func TestBlueGreenReaderNeverSeesPartialState(t *testing.T) {
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}

	// Version 1's first generation, live from the start, then a log of
	// 50,000 events that version 1 has processed: its table and
	// checkpoint are filled in bulk (the replay under test is version 2's).
	v1 := bgRunner(t, db, "v1", 1, false)
	if err := v1.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	g1 := generation(t, db, 1)
	if g1.State != projection.GenerationLive || g1.Schema != "rm_bgstats_g1" || g1.Subscriber != "bgstats#g1" {
		t.Fatalf("first generation: %+v", g1)
	}
	start := time.Now()
	if err := log.add(ctx, 50, 1000); err != nil {
		t.Fatal(err)
	}
	t.Logf("filled 50,000 events in %s", time.Since(start).Round(time.Millisecond))
	cps := pgx.Identifier{db.Schema}.Sanitize() + ".checkpoints"
	if _, err := db.Pool.Exec(ctx, `INSERT INTO rm_bgstats_g1.stats
		SELECT stream_id, count(*), sum((data->>'v')::bigint) FROM `+pgx.Identifier{db.Schema}.Sanitize()+`.events GROUP BY stream_id`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE `+cps+` SET position = (SELECT max(global_sequence) FROM `+
		pgx.Identifier{db.Schema}.Sanitize()+`.events) WHERE subscriber_id = 'bgstats#g1'`); err != nil {
		t.Fatal(err)
	}
	exactAt(t, db, "public.stats", "bgstats#g1", 1)
	stopV1 := bgRunInBackground(t, v1)

	// A writer appends streams of 10 events while the rebuild runs.
	wctx, stopWriter := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	var writeErr error
	go func() {
		defer wg.Done()
		for wctx.Err() == nil {
			if err := log.add(wctx, 1, 10); err != nil && wctx.Err() == nil {
				writeErr = err
				return
			}
			time.Sleep(20 * time.Millisecond) // the writer's pace, not a wait for a condition
		}
	}()

	// The reader: one statement per answer, through the stable view.
	var (
		rmu      sync.Mutex
		answers  = map[int]int{}
		lastSeen int64
		lastVer  int
		cutSeen  bool
		rollback bool // a rollback is under way: one step back to version 1 is expected
		readErr  error
	)
	rctx, stopReader := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for rctx.Err() == nil {
			m, err := readStats(rctx, db.Pool, "public.stats")
			lens := log.lengths()
			if err != nil {
				if rctx.Err() == nil {
					readErr = errors.Wrap(err, "read")
				}
				return
			}
			v, events, err := verdict(m, lens)
			rmu.Lock()
			back := rollback && v == 1 && lastVer == 2
			switch {
			case err != nil:
				readErr = err
			case back:
				rollback = false
			case events < lastSeen:
				readErr = errors.Newf("went back in time: %d events after %d", events, lastSeen)
			case v < lastVer:
				readErr = errors.Newf("version %d after version %d", v, lastVer)
			}
			if v == 2 && lastVer == 1 {
				cutSeen = true
			}
			answers[v]++
			lastSeen, lastVer = events, v
			failed := readErr != nil
			rmu.Unlock()
			if failed {
				return
			}
			time.Sleep(2 * time.Millisecond) // the reader's pace (it leaves the CPU to the rebuild), not a wait
		}
	}()

	v2 := bgRunner(t, db, "v2-rebuild", 2, false)
	start = time.Now()
	var last projection.RebuildProgress
	c, err := v2.RebuildBlueGreen(ctx, bgName, &projection.RebuildOptions{OnProgress: func(p projection.RebuildProgress) {
		if p.Done/10_000 > last.Done/10_000 {
			t.Logf("rebuild: %d/%d events, %.0f events/s", p.Done, p.Total, p.Rate)
		}
		last = p
	}})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("blue/green rebuild: %d events replayed in %s (%.0f events/s), cut-over %+v (%s, of which catching up %s, %d attempts)",
		last.Done, elapsed.Round(time.Millisecond), float64(last.Done)/elapsed.Seconds(), c, c.Duration, c.CatchUp, c.Attempts)
	if c.From != 1 || c.To != 2 || c.ToPosition < c.FromPosition || c.Views != 1 {
		t.Fatalf("cut-over: %+v", c)
	}
	// The part readers can wait for: the swap after the catch-up (during
	// which the old generation is held and readers read it as usual).
	if swap := c.Duration - c.CatchUp; swap > 500*time.Millisecond {
		t.Errorf("the cut-over's swap took %s (target 50 ms)", swap)
	} else {
		t.Logf("cut-over: view swap %s", swap)
	}
	// Readers now see version 2.
	annalstest.WaitFor(t, 5*time.Second, func() bool {
		rmu.Lock()
		defer rmu.Unlock()
		return lastVer == 2 || readErr != nil
	})
	// Version 2 runs live from here (the rebuild process returned).
	bgRunInBackground(t, bgRunner(t, db, "v2-live", 2, false))
	annalstest.WaitFor(t, 10*time.Second, func() bool { return state(t, db, 1) == projection.GenerationRetired })
	// Version 1's runner stops generation 1 where readers last saw it.
	before := exactAt(t, db, "rm_bgstats_g1.stats", "bgstats#g1", 1)
	if before > c.FromPosition {
		t.Fatalf("generation 1 moved on to %d after the cut-over at %d", before, c.FromPosition)
	}

	// Rollback: version 1 comes back, then catches up under its runner.
	rmu.Lock()
	rollback = true
	rmu.Unlock()
	rb, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rollback: %+v (%s)", rb, rb.Duration)
	if rb.From != 2 || rb.To != 1 {
		t.Fatalf("rollback: %+v", rb)
	}
	if _, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName); !errors.Is(err, projection.ErrNoRollback) {
		t.Fatalf("second rollback: %v, want ErrNoRollback", err)
	}
	stopWriter()
	head := headOf(t, db)
	annalstest.WaitForErr(t, 20*time.Second, func() error {
		m, err := readStats(ctx, db.Pool, "public.stats")
		if err != nil {
			return err
		}
		v, events, err := verdict(m, log.lengths())
		if err != nil {
			return err
		}
		var n int64
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{db.Schema}.Sanitize()+`.events`).Scan(&n); err != nil {
			return err
		}
		if v != 1 || events != n {
			return errors.Newf("version %d with %d events, want version 1 with %d (head %d)", v, events, n, head)
		}
		return nil
	})
	stopReader()
	wg.Wait()
	stopV1()
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	if readErr != nil {
		t.Fatal(readErr)
	}
	if !cutSeen || answers[1] == 0 || answers[2] == 0 {
		t.Fatalf("the reader saw %v answers per version (cut-over seen: %v)", answers, cutSeen)
	}
	t.Logf("reader answers per version: %v", answers)
	exactAt(t, db, "rm_bgstats_g1.stats", "bgstats#g1", 1)
	exactAt(t, db, "rm_bgstats_g2.stats", "bgstats#g2", 2)
}

func headOf(t *testing.T, db *annalstest.DB) int64 {
	t.Helper()
	var h int64
	if err := db.Pool.QueryRow(t.Context(), `SELECT coalesce(max(global_sequence), 0) FROM `+pgx.Identifier{db.Schema}.Sanitize()+`.events`).Scan(&h); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestBlueGreenAutoRebuild deploys version 2 with AutoRebuild beside a
// running version 1 while a writer appends: two version-2 instances build
// generation 2 between them and cut over by themselves, version 1 stops
// generation 1, and version 2 then follows the log live. Each generation
// holds every event exactly once.
func TestBlueGreenAutoRebuild(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 40, 100)
	bgRunInBackground(t, bgRunner(t, db, "v1", 1, false))

	wctx, stopWriter := context.WithCancel(ctx)
	writerDone := make(chan error, 1)
	go func() {
		for wctx.Err() == nil {
			if err := log.add(wctx, 1, 5); err != nil && wctx.Err() == nil {
				writerDone <- err
				return
			}
			time.Sleep(20 * time.Millisecond) // the writer's pace, not a wait for a condition
		}
		writerDone <- nil
	}()
	bgRunInBackground(t, bgRunner(t, db, "v2-a", 2, true))
	bgRunInBackground(t, bgRunner(t, db, "v2-b", 2, true))
	annalstest.WaitFor(t, 90*time.Second, func() bool {
		return state(t, db, 2) == projection.GenerationLive && state(t, db, 1) == projection.GenerationRetired
	})
	stopWriter()
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	g2 := generation(t, db, 2)
	if g2.Version != 2 || g2.CutoverMS == nil {
		t.Fatalf("generation 2: %+v", g2)
	}
	t.Logf("auto rebuild: cut over in %.2f ms at position %d", *g2.CutoverMS, *g2.CutoverPosition)
	gens, err := projection.ListGenerations(ctx, db.Pool, db.Schema, bgName)
	if err != nil {
		t.Fatal(err)
	}
	if len(gens) != 2 {
		t.Fatalf("%d generations, want 2: %+v", len(gens), gens)
	}
	head := headOf(t, db)
	annalstest.WaitFor(t, 30*time.Second, func() bool { return checkpointOf(t, db, "bgstats#g2") >= head })
	readerSees(t, db, log, 2)
	exactAt(t, db, "rm_bgstats_g1.stats", "bgstats#g1", 1)
	if pos := exactAt(t, db, "rm_bgstats_g2.stats", "bgstats#g2", 2); pos < head {
		t.Fatalf("generation 2 at %d, head %d", pos, head)
	}
}

// TestBlueGreenBadInput: mistakes are reported and change nothing.
func TestBlueGreenBadInput(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	r, err := projection.NewRunner(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Counted](reg, "bg.counted")
	noSetup := projection.New("nosetup", reg)
	projection.On(noSetup, func(context.Context, pgx.Tx, eventstore.Envelope[Counted]) error { return nil })
	if err := r.Register(noSetup, &projection.Options{BlueGreen: &projection.BlueGreen{Version: 1}}); err == nil ||
		!strings.Contains(err.Error(), "setup") {
		t.Fatalf("Register without a setup: %v", err)
	}
	if err := r.Register(statsProjection(1), &projection.Options{BlueGreen: &projection.BlueGreen{}}); err == nil {
		t.Fatal("Register with Version 0 succeeded")
	}
	obs := projection.NewObserver("obs", reg)
	projection.Observe(obs, func(context.Context, eventstore.Envelope[Counted]) error { return nil })
	if err := r.Register(obs, &projection.Options{BlueGreen: &projection.BlueGreen{Version: 1}}); err == nil {
		t.Fatal("Register of an observer with BlueGreen succeeded")
	}
	plain := projection.New("plain", reg)
	projection.On(plain, func(context.Context, pgx.Tx, eventstore.Envelope[Counted]) error { return nil })
	plain.OnReset(func(context.Context, pgx.Tx) error { return nil })
	if err := r.Register(plain, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(statsProjection(1), &projection.Options{BlueGreen: &projection.BlueGreen{Version: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RebuildBlueGreen(ctx, "plain", nil); !errors.Is(err, projection.ErrNotBlueGreen) {
		t.Fatalf("RebuildBlueGreen of a plain projection: %v", err)
	}
	if err := r.Rebuild(ctx, bgName, nil); !errors.Is(err, projection.ErrBlueGreenRebuild) || errors.Is(err, projection.ErrNotResetter) ||
		strings.Contains(err.Error(), "--blue-green") || !strings.Contains(err.Error(), "Runner.RebuildBlueGreen") {
		t.Fatalf("Rebuild in place of a blue/green projection: %v; want ErrBlueGreenRebuild pointing at Runner.RebuildBlueGreen", err)
	}
	if _, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName); !errors.Is(err, projection.ErrNoGenerations) {
		t.Fatalf("Rollback without generations: %v", err)
	}

	// A table in the way of the first generation's view: the error says so
	// and nothing is created.
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.stats (x int)`); err != nil {
		t.Fatal(err)
	}
	if err := r.RunUntilCaughtUp(ctx); err == nil || !strings.Contains(err.Error(), "in the way") {
		t.Fatalf("first generation with public.stats a table: %v", err)
	}
	if gens, err := projection.ListGenerations(ctx, db.Pool, db.Schema, bgName); err != nil || len(gens) != 0 {
		t.Fatalf("generations after a failed setup: %+v, %v", gens, err)
	}
	var exists bool
	if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'rm_bgstats_g1')`).Scan(&exists); err != nil || exists {
		t.Fatalf("schema rm_bgstats_g1 exists after a failed setup: %v, %v", exists, err)
	}
	if _, err := db.Pool.Exec(ctx, `DROP TABLE public.stats`); err != nil {
		t.Fatal(err)
	}
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName); !errors.Is(err, projection.ErrNoRollback) {
		t.Fatalf("Rollback with one generation: %v", err)
	}

	// Grants on the views survive the cut-over; DropRetired drops the old
	// generation, after which there is nothing to roll back to.
	role := "bg_reader_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := db.Pool.Exec(ctx, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+pgx.Identifier{role}.Sanitize())
		_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+pgx.Identifier{role}.Sanitize())
	})
	if _, err := db.Pool.Exec(ctx, `GRANT SELECT ON public.stats TO `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	log := &bgLog{db: db}
	if err := log.add(ctx, 3, 10); err != nil {
		t.Fatal(err)
	}
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	v2 := bgRunner(t, db, "v2", 2, false)
	c, err := v2.RebuildBlueGreen(ctx, bgName, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.From != 1 || c.To != 2 {
		t.Fatalf("cut-over: %+v", c)
	}
	readerSees(t, db, log, 2)
	var can bool
	if err := db.Pool.QueryRow(ctx, `SELECT has_table_privilege($1, 'public.stats', 'SELECT')`, role).Scan(&can); err != nil || !can {
		t.Fatalf("the reader role lost SELECT on the view at the cut-over: %v, %v", can, err)
	}
	dropped, err := projection.DropRetired(ctx, db.Pool, db.Schema, bgName, 0)
	if err != nil || !slices.Equal(dropped, []int{1}) {
		t.Fatalf("DropRetired: %v, %v", dropped, err)
	}
	if s := state(t, db, 1); s != projection.GenerationDropped {
		t.Fatalf("generation 1 is %s after DropRetired", s)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'rm_bgstats_g1')`).Scan(&exists); err != nil || exists {
		t.Fatalf("schema rm_bgstats_g1 exists after DropRetired: %v, %v", exists, err)
	}
	if _, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName); !errors.Is(err, projection.ErrNoRollback) {
		t.Fatalf("Rollback after the old generation was dropped: %v", err)
	}
	readerSees(t, db, log, 2)
}

// A runner of a newer version without AutoRebuild runs nothing of the read
// model; it says so, and why, instead of nothing at all (an operator rolling
// out version 2 must keep version 1 running, or build version 2).
func TestBlueGreenIdleRunnerSaysWhy(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	if err := bgRunner(t, db, "v1", 1, false).RunUntilCaughtUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	var logs annalstest.LogBuffer
	r, err := projection.NewRunner(db.Pool, &projection.Config{
		InstanceID: "v2", PollInterval: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(statsProjection(2), &projection.Options{BlueGreen: &projection.BlueGreen{
		Version: 2, CheckInterval: 100 * time.Millisecond,
	}}); err != nil {
		t.Fatal(err)
	}
	bgRunInBackground(t, r)
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		return strings.Contains(logs.String(), "runs no generation of the blue/green read model")
	})
	if l := logs.String(); !strings.Contains(l, "the live generation is version 1, and BlueGreen.AutoRebuild is off") ||
		!strings.Contains(l, "level=WARN") {
		t.Fatalf("the idle runner's log:\n%s", l)
	}
}
