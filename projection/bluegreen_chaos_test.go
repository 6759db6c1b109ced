package projection_test

// TestBlueGreenChaos, an adversarial test of blue/green rebuilds: a
// partitioned blue/green projection live and read through its reader view,
// writers appending with random delays (a quarter of their transactions
// roll back), an awaiter checking read-your-writes, while generation 2 is
// built by RebuildBlueGreen attempts that are cancelled and whose
// connections are cut, beside runners of both versions that are replaced
// at random (context cancel) and whose connections are cut; then the
// cut-over, a rollback to generation 1, and a build of generation 3 under
// the same churn.

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/childproc"
	"github.com/annals-dev/annals/projection"
)

const (
	bgcName  = "bgchaos"
	bgcParts = 2
)

// BgcEvent is the chaos test's event.
type BgcEvent struct {
	N int `json:"n"`
}

// bgcProjection records each event it applies in applied, tagged with the
// generation's schema (its search_path's first: current_schema()). No key:
// a second application is counted, not refused.
func bgcProjection() *projection.Typed {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[BgcEvent](reg, "bgc.ev")
	p := projection.New(bgcName, reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE applied (event_id uuid NOT NULL, seq bigint NOT NULL,
		stream text NOT NULL, sv bigint NOT NULL, gen text NOT NULL)`))
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[BgcEvent]) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1, $2, $3, $4, current_schema())`,
			e.ID, e.GlobalSequence, e.StreamID, e.StreamVersion)
		return err
	})
	return p
}

type bgcMember struct {
	id      string
	version int
	cancel  context.CancelFunc
	done    <-chan struct{}
	pool    *pgxpool.Pool
	log     *lockedBuffer
	stopped atomic.Bool
}

type bgcChaos struct {
	t     *testing.T
	db    *annalstest.DB
	store *eventstore.Store
	qs    string // the quoted annals schema

	mu      sync.Mutex
	rng     *rand.Rand
	members []*bgcMember
	n       int
	// rbStart and rbEnd count the rollbacks begun and returned.
	rbStart, rbEnd atomic.Int64
}

func (c *bgcChaos) intn(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rng.IntN(n)
}

func (c *bgcChaos) newRunner(id string, version int) (*projection.Runner, *pgxpool.Pool, *lockedBuffer) {
	c.t.Helper()
	pool, err := childproc.Pool(context.Background(), c.db.URL, id)
	if err != nil {
		c.t.Fatal(err)
	}
	log := &lockedBuffer{}
	r, err := projection.NewRunner(pool, &projection.Config{
		InstanceID: id, PollInterval: 100 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
		LockRetryInterval: 200 * time.Millisecond, ShutdownTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo})).With(slog.String("instance", id)),
	})
	if err != nil {
		c.t.Fatal(err)
	}
	if err := r.Register(bgcProjection(), &projection.Options{Partitions: bgcParts, BatchSize: 20,
		BlueGreen: &projection.BlueGreen{Version: version, CheckInterval: 100 * time.Millisecond}}); err != nil {
		c.t.Fatal(err)
	}
	return r, pool, log
}

// start starts a runner of version in this process.
func (c *bgcChaos) start(version int) *bgcMember {
	c.t.Helper()
	c.mu.Lock()
	c.n++
	id := fmt.Sprintf("v%d-%d", version, c.n)
	c.mu.Unlock()
	r, pool, log := c.newRunner(id, version)
	ctx, cancel := context.WithCancel(context.Background())
	done, err := r.Start(ctx)
	if err != nil {
		cancel()
		c.t.Fatal(err)
	}
	m := &bgcMember{id: id, version: version, cancel: cancel, done: done, pool: pool, log: log}
	c.mu.Lock()
	c.members = append(c.members, m)
	c.mu.Unlock()
	c.t.Cleanup(func() { c.stop(m) })
	return m
}

// stop cancels m's context and waits for it to stop.
func (c *bgcChaos) stop(m *bgcMember) {
	if m.stopped.Swap(true) {
		return
	}
	m.cancel()
	select {
	case <-m.done:
	case <-time.After(15 * time.Second):
		c.t.Errorf("runner %s has not stopped 15s after its context ended", m.id)
	}
	m.pool.Close()
	if c.t.Failed() {
		c.t.Logf("log of runner %s:\n%s", m.id, childproc.Tail(m.log.String(), 6000))
	}
}

// cut terminates the backends of application name id.
func (c *bgcChaos) cut(id string) int {
	var n int
	_ = c.db.Pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, id).Scan(&n)
	return n
}

// startChurn runs churn of versions in a goroutine and returns what stops
// it and waits for it (once; later calls return at once).
func (c *bgcChaos) startChurn(versions []int) (stop func()) {
	stopCh, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); c.churn(stopCh, versions) }()
	var once sync.Once
	return func() { once.Do(func() { close(stopCh); <-done }) }
}

// churn replaces runners and cuts connections at random until stop is
// closed: each version keeps at least one runner.
func (c *bgcChaos) churn(stop <-chan struct{}, versions []int) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(150+c.intn(400)) * time.Millisecond): // the churn's pace, not a wait for a condition
		}
		v := versions[c.intn(len(versions))]
		c.mu.Lock()
		var mine []*bgcMember
		for _, m := range c.members {
			if m.version == v && !m.stopped.Load() {
				mine = append(mine, m)
			}
		}
		c.mu.Unlock()
		switch {
		case len(mine) == 0:
			c.start(v)
		case c.intn(2) == 0:
			// Replace one: the new one first, then cancel the old.
			c.start(v)
			c.stop(mine[c.intn(len(mine))])
		default:
			c.cut(mine[c.intn(len(mine))].id)
		}
	}
}

// rebuild runs RebuildBlueGreen of version 2 until one returns a cut-over
// (ok), or, with only > 0, that many attempts, or until generation target
// is live: attempts are cancelled at random moments and their connections
// cut, but for the seventh and later. The attempts end by deadline, but the
// seventh, which runs undisturbed and gets twice deadline of its own: on
// a loaded machine the six interrupted ones could use up the time a
// rebuild needs to finish.
func (c *bgcChaos) rebuild(deadline time.Duration, only, target int) (cut projection.Cutover, ok bool) {
	c.t.Helper()
	end := time.Now().Add(deadline)
	// With only > 0, attempts go on past only while none has registered
	// the target generation (a loaded machine can take longer than the
	// interruption's delay to get that far; the delay grows with the
	// attempt for that reason too).
	more := func(attempt int) bool {
		return only == 0 || attempt <= only || (bgcState(c.t, c, target) == "" && time.Now().Before(end))
	}
	for attempt := 1; (time.Now().Before(end) || attempt == 7) && more(attempt); attempt++ {
		if bgcState(c.t, c, target) == projection.GenerationLive {
			// Cut over by a runner: another attempt would build a new one.
			return projection.Cutover{}, false
		}
		id := fmt.Sprintf("rb-%d", attempt)
		r, pool, log := c.newRunner(id, 2)
		until := time.Until(end)
		if attempt == 7 {
			until = max(until, 2*deadline)
		}
		ctx, cancel := context.WithTimeout(context.Background(), until)
		interrupt := make(chan struct{})
		go func() {
			defer close(interrupt)
			if attempt > 6 {
				return // let it finish
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(attempt*(100+c.intn(700))) * time.Millisecond): // when to interrupt, not a wait
			}
			if c.intn(2) == 0 {
				cancel()
			} else {
				c.cut(id)
			}
		}()
		cut, err := r.RebuildBlueGreen(ctx, bgcName, &projection.RebuildOptions{BatchSize: 10 + c.intn(40), LockTimeout: 10 * time.Second})
		cancel()
		<-interrupt
		pool.Close()
		if err == nil {
			c.t.Logf("rebuild attempt %d cut over: %+v", attempt, cut)
			return cut, true
		}
		c.t.Logf("rebuild attempt %d: %v", attempt, err)
		if attempt > 6 {
			c.t.Logf("log of %s:\n%s", id, childproc.Tail(log.String(), 4000))
		}
	}
	if only == 0 {
		c.t.Fatalf("no rebuild cut over within %s (and %s for the undisturbed attempt)", deadline, 2*deadline)
	}
	return projection.Cutover{}, false
}

func (c *bgcChaos) liveGen(ctx context.Context) (int, error) {
	var n, gen int
	err := c.db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(max(generation), 0) FROM `+c.qs+
		`.read_model_generations WHERE projection = $1 AND state = 'live'`, bgcName).Scan(&n, &gen)
	if err == nil && n != 1 {
		err = errors.Newf("%d live generations", n)
	}
	return gen, err
}

type bgcRow struct {
	id     uuid.UUID
	seq    int64
	stream string
	sv     int64
	gen    string
}

func readApplied(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, table string) ([]bgcRow, error) {
	rows, err := db.Query(ctx, `SELECT event_id, seq, stream, sv, gen FROM `+table)
	if err != nil {
		return nil, err
	}
	var out []bgcRow
	var r bgcRow
	_, err = pgx.ForEachRow(rows, []any{&r.id, &r.seq, &r.stream, &r.sv, &r.gen}, func() error { out = append(out, r); return nil })
	return out, err
}

// consistent checks one answer of the reader view: one generation (want,
// one of the generations live before or after the read), each event once,
// and per stream a prefix of its versions.
func consistent(rows []bgcRow, want ...int) error {
	gens := map[string]bool{}
	for _, g := range want {
		gens[generationSchemaOf(g)] = true
	}
	seen := map[uuid.UUID]bool{}
	maxSV := map[string]int64{}
	count := map[string]int64{}
	var gen string
	for _, r := range rows {
		if gen == "" {
			gen = r.gen
			if !gens[gen] {
				return errors.Newf("readers see %s, live was %v", gen, want)
			}
		} else if r.gen != gen {
			return errors.Newf("mixed generations: %s and %s", gen, r.gen)
		}
		if seen[r.id] {
			return errors.Newf("event %s (%d) applied twice in %s", r.id, r.seq, gen)
		}
		seen[r.id] = true
		maxSV[r.stream] = max(maxSV[r.stream], r.sv)
		count[r.stream]++
	}
	for s, m := range maxSV {
		if count[s] != m {
			return errors.Newf("%s: stream %s has %d events up to version %d: not a prefix", gen, s, count[s], m)
		}
	}
	return nil
}

func generationSchemaOf(gen int) string { return fmt.Sprintf("rm_%s_g%d", bgcName, gen) }

// snapshot is what a generation holds: its rows and checkpoints.
func (c *bgcChaos) snapshot(gen int) string {
	c.t.Helper()
	var s string
	if err := c.db.Pool.QueryRow(c.t.Context(), `SELECT (SELECT count(*) || '/' || coalesce(max(seq), 0) || '/' || coalesce(sum(seq), 0) FROM `+
		generationSchemaOf(gen)+`.applied) || ' ' || (SELECT string_agg(partition || ':' || position, ',' ORDER BY partition) FROM `+c.qs+
		`.checkpoints WHERE subscriber_id = $1)`, fmt.Sprintf("%s#g%d", bgcName, gen)).Scan(&s); err != nil {
		c.t.Fatal(err)
	}
	return s
}

// exact checks that generation gen holds every event of the log through
// its partitions' checkpoints exactly once, and nothing else; it returns
// its lowest checkpoint.
func (c *bgcChaos) exact(gen int) int64 {
	c.t.Helper()
	ctx := c.t.Context()
	got, err := readApplied(ctx, c.db.Pool, generationSchemaOf(gen)+".applied")
	if err != nil {
		c.t.Fatal(err)
	}
	rows, err := c.db.Pool.Query(ctx, `SELECT e.event_id, e.global_sequence, e.stream_id, e.stream_version, ''
		FROM `+c.qs+`.events e JOIN `+c.qs+`.checkpoints cp
		  ON cp.subscriber_id = $1 AND cp.partition = `+c.qs+`.stream_partition(e.stream_id, $2)
		WHERE e.global_sequence <= cp.position`, fmt.Sprintf("%s#g%d", bgcName, gen), bgcParts)
	if err != nil {
		c.t.Fatal(err)
	}
	var want []bgcRow
	var r bgcRow
	if _, err := pgx.ForEachRow(rows, []any{&r.id, &r.seq, &r.stream, &r.sv, &r.gen}, func() error { want = append(want, r); return nil }); err != nil {
		c.t.Fatal(err)
	}
	have := map[uuid.UUID]int{}
	for _, g := range got {
		if g.gen != generationSchemaOf(gen) {
			c.t.Fatalf("generation %d holds a row of %s", gen, g.gen)
		}
		have[g.id]++
	}
	for _, w := range want {
		if have[w.id] != 1 {
			c.t.Fatalf("generation %d applied event %d (%s v%d) %d times, want once", gen, w.seq, w.stream, w.sv, have[w.id])
		}
	}
	if len(got) != len(want) {
		c.t.Fatalf("generation %d holds %d rows, the log through its checkpoints %d events", gen, len(got), len(want))
	}
	var lo int64
	if err := c.db.Pool.QueryRow(ctx, `SELECT coalesce(min(position), 0) FROM `+c.qs+`.checkpoints WHERE subscriber_id = $1`,
		fmt.Sprintf("%s#g%d", bgcName, gen)).Scan(&lo); err != nil {
		c.t.Fatal(err)
	}
	return lo
}

// TestBlueGreenChaos checks, throughout: every answer of the reader view
// is one generation, live before or after the read, each event once, and
// per stream a prefix of its events; exactly one generation is live; an
// Await that returned (no rollback around it) is followed by a read that
// sees the event and its stream through it. After each cut-over the
// retired generation is not written again (its rows and checkpoints as
// they were), nor generation 2 after the rollback; at the end each
// generation holds the log through its checkpoints exactly once, the
// retired ones' checkpoints are stopped, the live one's not, and
// generation 3 replaced generation 1. (The race of Await with a rollback
// that TestBlueGreenAwaitRollbackBetweenReads pins was found reading the
// code for this test; the test itself seldom hits it.)
func TestBlueGreenChaos(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[BgcEvent](reg, "bgc.ev")
	store, err := eventstore.New(db.Pool, &eventstore.Config{Schema: db.Schema, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	c := &bgcChaos{t: t, db: db, store: store, qs: pgx.Identifier{db.Schema}.Sanitize(), rng: rand.New(rand.NewPCG(uint64(seed), 7))}

	// Generation 1, live, over a log of 4,000 events that a rebuild
	// takes a while to replay.
	if _, err := db.Pool.Exec(ctx, `SELECT `+c.qs+`.append_events('seed-' || s, 0,
		(SELECT jsonb_agg(jsonb_build_object('type', 'bgc.ev', 'data', jsonb_build_object('n', i)) ORDER BY i)
		   FROM generate_series(1, 40) i)) FROM generate_series(1, 100) s`); err != nil {
		t.Fatal(err)
	}
	c.start(1)
	c.start(1)
	annalstest.WaitForErr(t, 20*time.Second, func() error { _, err := c.liveGen(ctx); return err })
	annalstest.WaitFor(t, 20*time.Second, func() bool { return checkpointOf(t, db, bgcName+"#g1") >= 4000 })

	var (
		wg       sync.WaitGroup
		failMu   sync.Mutex
		failures []error
		awaited  atomic.Int64
		checked  atomic.Int64
		reads    atomic.Int64
	)
	fail := func(err error) {
		failMu.Lock()
		defer failMu.Unlock()
		if len(failures) < 10 {
			failures = append(failures, err)
		}
	}
	stopWork := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stopWork:
			return true
		default:
			return false
		}
	}

	// Writers: random delays, a quarter of the transactions roll back.
	errRollBack := errors.New("the writer rolls back")
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stopped() {
				time.Sleep(time.Duration(c.intn(30)) * time.Millisecond) // the writer's pace, not a wait for a condition
				stream := fmt.Sprintf("w%d-%d", w, c.intn(15))
				evs := make([]eventstore.EventData, 1+c.intn(3))
				for i := range evs {
					evs[i] = eventstore.NewEvent(BgcEvent{N: i})
				}
				back := c.intn(4) == 0
				_, err := store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
					if _, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, float64(c.intn(15))/1000); err != nil {
						return err
					}
					if err := b.Append(stream, eventstore.Any, evs...); err != nil {
						return err
					}
					if back {
						return errRollBack
					}
					return nil
				})
				if back && errors.Is(err, errRollBack) {
					continue
				}
				if err != nil {
					fail(errors.Wrap(err, "writer"))
					return
				}
			}
		}()
	}

	// The reader: one statement per answer, through the reader view.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stopped() {
			before, err := c.liveGen(ctx)
			if err != nil {
				fail(errors.Wrap(err, "reader: generations"))
				return
			}
			rows, err := readApplied(ctx, db.Pool, "public.applied")
			if err != nil {
				fail(errors.Wrap(err, "reader"))
				return
			}
			after, err := c.liveGen(ctx)
			if err != nil {
				fail(errors.Wrap(err, "reader: generations"))
				return
			}
			if err := consistent(rows, before, after); err != nil {
				fail(errors.Wrap(err, "reader"))
				return
			}
			reads.Add(1)
			time.Sleep(5 * time.Millisecond) // the reader's pace, not a wait for a condition
		}
	}()

	// The awaiter: append, Await, and read the event through the view.
	awaiter, err := projection.NewAwaiter(db.Pool, &projection.AwaitOptions{Schema: db.Schema, PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer awaiter.Close()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stopped(); i++ {
			stream := fmt.Sprintf("aw-%d", i%10)
			res, err := store.Append(ctx, stream, eventstore.Any, eventstore.NewEvent(BgcEvent{N: i}))
			if err != nil {
				fail(errors.Wrap(err, "awaiter: append"))
				return
			}
			ev := res.Events[0]
			// The rollbacks before the wait, ended first: s0 == e0 says
			// none was under way when the wait began. (Read after the
			// wait, a rollback that committed after Await's last read but
			// before this load went unseen: Await rightly answered for
			// generation 2, and the read below saw generation 1.)
			e0 := c.rbEnd.Load()
			s0 := c.rbStart.Load()
			actx, cancel := context.WithTimeout(ctx, 20*time.Second)
			err = awaiter.Await(actx, bgcName, ev.GlobalSequence)
			cancel()
			if err != nil {
				fail(errors.Wrapf(err, "awaiter: Await %d", ev.GlobalSequence))
				return
			}
			awaited.Add(1)
			var has, prefix int64
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE event_id = $1), count(*) FILTER (WHERE sv <= $3)
				FROM public.applied WHERE stream = $2`, ev.ID, stream, ev.StreamVersion).Scan(&has, &prefix); err != nil {
				fail(errors.Wrap(err, "awaiter: read"))
				return
			}
			if s0 != e0 || c.rbStart.Load() != s0 {
				continue // a rollback around: readers may be taken back before the event
			}
			checked.Add(1)
			if has != 1 || prefix != ev.StreamVersion {
				gen, _ := c.liveGen(ctx)
				fail(errors.Newf("awaiter: Await(%d) returned, but readers (g%d) see the event %d times and %d of the %d events of %s through it",
					ev.GlobalSequence, gen, has, prefix, ev.StreamVersion, stream))
				return
			}
		}
	}()
	checkFailures := func(when string) {
		t.Helper()
		failMu.Lock()
		defer failMu.Unlock()
		if len(failures) > 0 {
			for _, f := range failures {
				t.Errorf("%s: %v", when, f)
			}
			t.FailNow()
		}
	}
	progress := func(n int64) {
		t.Helper()
		from := awaited.Load()
		annalstest.WaitFor(t, 20*time.Second, func() bool {
			failMu.Lock()
			defer failMu.Unlock()
			return awaited.Load() >= from+n || len(failures) > 0
		})
	}
	progress(10)
	checkFailures("generation 1")

	// Generation 2: built by RebuildBlueGreen while version 1's runners
	// churn. (No runner of version 2 yet: one that cut generation 2 over
	// just before an attempt registered its build would have the attempt
	// build a generation 3.)
	stopChurn := c.startChurn([]int{1})
	// Stopped before the test ends however it ends: a churn left running
	// after a t.Fatal here started runners after the test had completed,
	// whose failures then panicked the package's run.
	defer stopChurn()
	cut, _ := c.rebuild(30*time.Second, 0, 2)
	stopChurn()
	if cut.From != 1 || cut.To != 2 {
		t.Fatalf("the cut-over went %d -> %d, want 1 -> 2", cut.From, cut.To)
	}
	g1 := c.snapshot(1)
	// Runners of both versions churn from here to the end (those of
	// version 2 follow generation 2, and build generation 3).
	c.start(2)
	stopChurn = c.startChurn([]int{1, 2})
	defer stopChurn()
	progress(10)
	checkFailures("generation 2")
	if s := bgcState(t, c, 1); s != projection.GenerationRetired {
		t.Fatalf("generation 1 is %s after the cut-over", s)
	}
	if got := c.snapshot(1); got != g1 {
		t.Fatalf("generation 1 was written after the cut-over: %s, then %s", g1, got)
	}

	// Rollback to generation 1, which version 1's runners catch up.
	c.rbStart.Add(1)
	rb, err := projection.Rollback(ctx, db.Pool, db.Schema, bgcName)
	c.rbEnd.Add(1)
	if err != nil || rb.From != 2 || rb.To != 1 {
		t.Fatalf("rollback: %+v, %v", rb, err)
	}
	g2 := c.snapshot(2)
	progress(10)
	checkFailures("after the rollback")
	if s := bgcState(t, c, 2); s != projection.GenerationRetired {
		t.Fatalf("generation 2 is %s after the rollback", s)
	}

	// Generation 3 (version 2 again), under the same churn: rebuilds
	// register it and are interrupted; the runners of version 2 build it
	// and cut it over.
	// (An attempt that finds generation 3 cut over by a runner under it
	// says so with From 0.)
	if cut, ok := c.rebuild(30*time.Second, 3, 3); ok && ((cut.From != 1 && cut.From != 0) || cut.To != 3) {
		t.Fatalf("the second cut-over went %d -> %d, want 1 -> 3", cut.From, cut.To)
	} else if !ok {
		// A loaded machine (the whole suite beside it) takes tens of
		// seconds for what an idle one does in two, and the churn can
		// replace the builders faster than they catch up with the writers:
		// after 30 s the churn stops (the rest of the test runs without
		// it), and the runners must cut over then.
		live := func() bool { return bgcState(t, c, 3) == projection.GenerationLive }
		if _, ok := eventually(30*time.Second, live); !ok {
			t.Logf("no cut-over to generation 3 within 30s under churn (generation 3 is %q): the churn stops", bgcState(t, c, 3))
			stopChurn()
			if _, ok := eventually(90*time.Second, live); !ok {
				// What the builders did: generation 3's checkpoints
				// against the head (a builder that cannot catch up with
				// the writers would be a liveness gap, not load).
				var head int64
				_ = db.Pool.QueryRow(ctx, `SELECT coalesce(max(global_sequence), 0) FROM `+c.qs+`.events`).Scan(&head)
				rows, _ := db.Pool.Query(ctx, `SELECT partition, position, coalesce(stopped_reason, '') FROM `+c.qs+
					`.checkpoints WHERE subscriber_id = $1 ORDER BY partition`, bgcName+"#g3")
				cps, _ := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
					var part, cp int64
					var why string
					err := r.Scan(&part, &cp, &why)
					return fmt.Sprintf("partition %d at %d %s", part, cp, why), err
				})
				t.Fatalf("generation 3 (%q) not cut over 90 s after the churn stopped; head %d; its checkpoints: %v",
					bgcState(t, c, 3), head, cps)
			}
		}
		t.Logf("the runners cut over to generation 3")
	}
	if s := bgcState(t, c, 1); s != projection.GenerationRetired {
		t.Fatalf("generation 1 is %s after the second cut-over", s)
	}
	g1 = c.snapshot(1)
	progress(10)
	close(stopWork)
	wg.Wait()
	checkFailures("generation 3")

	// Generation 3 follows the log to its head.
	var head int64
	if err := db.Pool.QueryRow(ctx, `SELECT max(global_sequence) FROM `+c.qs+`.events`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool { return checkpointOf(t, db, bgcName+"#g3") >= head })
	if got := c.snapshot(1); got != g1 {
		t.Fatalf("generation 1 was written after the second cut-over: %s, then %s", g1, got)
	}
	if got := c.snapshot(2); got != g2 {
		t.Fatalf("generation 2 was written after the rollback: %s, then %s", g2, got)
	}
	for gen, want := range map[int]projection.GenerationState{1: projection.GenerationRetired, 2: projection.GenerationRetired, 3: projection.GenerationLive} {
		if s := bgcState(t, c, gen); s != want {
			t.Errorf("generation %d is %s, want %s", gen, s, want)
		}
	}
	// A retired generation's checkpoints carry a stop reason (no leader
	// processes them), the live one's none.
	for gen, want := range map[int]bool{1: true, 2: true, 3: false} {
		var stopped, n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE stopped_reason IS NOT NULL), count(*) FROM `+c.qs+
			`.checkpoints WHERE subscriber_id = $1`, fmt.Sprintf("%s#g%d", bgcName, gen)).Scan(&stopped, &n); err != nil {
			t.Fatal(err)
		}
		if n != bgcParts || (stopped == n) != want || (stopped == 0) == want {
			t.Errorf("generation %d: %d of %d checkpoints stopped, want all: %v", gen, stopped, n, want)
		}
	}
	gens, err := projection.ListGenerations(ctx, db.Pool, db.Schema, bgcName)
	if err != nil || len(gens) != 3 {
		t.Fatalf("generations: %+v, %v", gens, err)
	}
	if r := gens[2].Replaced; r == nil || *r != 1 {
		t.Errorf("generation 3 replaced %v, want 1", r)
	}
	for gen := 1; gen <= 3; gen++ {
		t.Logf("generation %d: exactly once through %d", gen, c.exact(gen))
	}
	rows, err := readApplied(ctx, db.Pool, "public.applied")
	if err != nil {
		t.Fatal(err)
	}
	if err := consistent(rows, 3); err != nil {
		t.Fatal(err)
	}
	t.Logf("head %d; %d reads, %d awaits (%d checked), %d runners started", head, reads.Load(), awaited.Load(), checked.Load(), c.n)
}

func bgcState(t *testing.T, c *bgcChaos, gen int) projection.GenerationState {
	t.Helper()
	gens, err := projection.ListGenerations(t.Context(), c.db.Pool, c.db.Schema, bgcName)
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
