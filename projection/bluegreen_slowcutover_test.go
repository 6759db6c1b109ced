package projection_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// slowStatsProjection is statsProjection whose handler works for work per
// event.
func slowStatsProjection(version int, work time.Duration) *projection.Typed {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Counted](reg, "bg.counted")
	p := projection.New(bgName, reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE stats (stream text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)`))
	bonus := int64(0)
	if version >= 2 {
		bonus = bgBonus
	}
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Counted]) error {
		time.Sleep(work) // the handler's own work, not a wait for a condition
		_, err := tx.Exec(ctx, `INSERT INTO stats VALUES ($1, 1, $2)
			ON CONFLICT (stream) DO UPDATE SET n = stats.n + 1, total = stats.total + $2`, e.StreamID, e.Data.V+bonus)
		return err
	})
	return p
}

// appendSteadily appends a stream of per events every interval until stop
// is called (or the test ends).
func appendSteadily(t *testing.T, log *bgLog, per int, interval time.Duration) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			if err := log.add(ctx, 1, per); err != nil && ctx.Err() == nil {
				werr = err
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			if werr != nil {
				t.Errorf("writer: %v", werr)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// A blue/green rebuild whose new version handles an event in 2 ms, while
// a writer appends 75 events a second, cuts over. The cut-over's
// catch-up, done while it holds the live generation, is bounded by
// CutoverLockTimeout (here 500 ms), and it used to be handed any gap up
// to a batch (5,000 events by default): the gap the replay of the log left
// (the events appended meanwhile, about a thousand), several times what
// the new version replays in that time. Each attempt ran out of time, and
// its deadline cut off the batch under way on the session holding the
// partition's lock, which lost the lock and failed the rebuild; with the
// batch finished instead, every attempt still failed with
// ErrCutoverBehind. The rebuild now catches up outside the cut-over until
// what is left fits the timeout at the pace it measured, and the deadline
// stops the catch-up between batches.
//
// Not parallel: the rebuild must outpace the writer, and its pace is
// measured; beside other tests of the package on a loaded 2-core machine
// it took up to 74 s instead of 15.
func TestBlueGreenRebuildWithSlowHandlerCutsOver(t *testing.T) {
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	live, err := projection.NewRunner(db.Pool, &projection.Config{
		InstanceID: "live", PollInterval: 50 * time.Millisecond, RetryBackoff: 50 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	bg := func(version int) *projection.BlueGreen {
		return &projection.BlueGreen{Version: version, CheckInterval: 100 * time.Millisecond,
			CutoverAttempts: 2, CutoverLockTimeout: 500 * time.Millisecond}
	}
	if err := live.Register(statsProjection(1), &projection.Options{BlueGreen: bg(1)}); err != nil {
		t.Fatal(err)
	}
	if err := log.add(ctx, 400, 10); err != nil {
		t.Fatal(err)
	}
	if err := live.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	bgRunInBackground(t, live)
	stopWriter := appendSteadily(t, log, 3, 40*time.Millisecond) // 75/s: far below the 500/s the slow version replays at most, even under -race on a loaded machine

	rebuilder, err := projection.NewRunner(db.Pool, &projection.Config{
		InstanceID: "rebuild", PollInterval: 50 * time.Millisecond, RetryBackoff: 50 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rebuilder.Register(slowStatsProjection(2, 2*time.Millisecond), &projection.Options{BlueGreen: bg(2)}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	start := time.Now()
	c, err := rebuilder.RebuildBlueGreen(rctx, bgName, nil)
	if err != nil {
		t.Fatalf("the blue/green rebuild of a slow version under steady appends did not cut over (after %v): %v", time.Since(start), err)
	}
	t.Logf("cut-over after %v: %+v", time.Since(start), c)
	// The catch-up fits the CutoverLockTimeout, give or take a batch under
	// way at its deadline.
	if c.To != 2 || c.From != 1 || c.CatchUp > time.Second {
		t.Fatalf("cut over %+v, want from 1 to 2 with a catch-up within about the 500ms CutoverLockTimeout", c)
	}
	g2 := generation(t, db, 2)
	if g2.State != projection.GenerationLive || g2.Replaced == nil || *g2.Replaced != 1 {
		t.Fatalf("generation 2 is %+v, want live, replacing generation 1", g2)
	}
	stopWriter()
	head := headOf(t, db)
	bgRunInBackground(t, rebuilder) // runs generation 2, live
	annalstest.WaitFor(t, 30*time.Second, func() bool { return checkpointsOf(t, db, bgName+"#g2")[0] >= head })
	for p, pos := range checkpointsOf(t, db, bgName+"#g1") {
		if pos > c.FromPosition {
			t.Errorf("generation 1 partition %d moved on to %d after the cut-over at %d", p, pos, c.FromPosition)
		}
	}
	exactThroughCheckpoints(t, db, "rm_bgstats_g1.stats", bgName+"#g1", 1, 1)
	exactThroughCheckpoints(t, db, "rm_bgstats_g2.stats", bgName+"#g2", 2, 1)
	readerSees(t, db, log, 2)
}
