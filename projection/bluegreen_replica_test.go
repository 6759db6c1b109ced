package projection_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/projection"
)

// batchReads is a pgx tracer that counts the events the engine's batch
// reads (the statements that read the events with the batch header)
// returned on the pool it traces: the rows of each, less its header row.
type batchReads struct {
	mu     sync.Mutex
	events int64
}

type batchReadKey struct{}

func (c *batchReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, batchReadKey{}, strings.Contains(d.SQL, "WITH h AS MATERIALIZED"))
}

func (c *batchReads) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if read, _ := ctx.Value(batchReadKey{}).(bool); !read || d.Err != nil {
		return
	}
	c.mu.Lock()
	c.events += max(d.CommandTag.RowsAffected()-1, 0)
	c.mu.Unlock()
}

// take returns the events counted since the last take.
func (c *batchReads) take() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.events
	c.events = 0
	return n
}

// TestBlueGreenReadReplica rebuilds a blue/green read model by a runner
// whose Config.ReadPool is a real streaming replica (of a cluster of the
// test's own), counting the events that the batch reads return on the
// replica and on the primary (a tracer on each pool), in three rebuilds:
//
//   - with the replica caught up, every event of the replay is read from
//     the replica and none from the primary;
//   - with the replica's WAL replay paused during the replay while more
//     events are appended on the primary, then resumed, the rebuild cuts
//     over with every event applied exactly once;
//   - with the replay paused before the rebuild and until after it, events
//     appended on the primary meanwhile (and during the rebuild, with the
//     live generation following them on the primary) are in the new
//     generation after the cut-over: the replica serves what it shows, the
//     primary the rest, and neither the replay nor the cut-over waits for
//     the replica. The replica lacks 6000 events, far more than the
//     cut-over could replay within its lock timeout (300ms, one attempt):
//     the rounds before it replay them from the primary.
func TestBlueGreenReadReplica(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cluster, h := clusterOfItsOwn(ctx, t)
	db := &annalstest.DB{URL: cluster.URL(), Name: "postgres", Schema: "annals", Pool: h.pool}
	log := &bgLog{db: db}

	replica, err := pgcluster.StartReplica(ctx, db.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Stop(context.Background()) })
	onReplica, onPrimary := &batchReads{}, &batchReads{}
	rc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	rc.ConnConfig.Host, rc.ConnConfig.Port = "127.0.0.1", uint16(replica.Port())
	rc.ConnConfig.Fallbacks = nil
	rc.ConnConfig.Tracer = onReplica
	readPool, err := pgxpool.NewWithConfig(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(readPool.Close)
	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Tracer = onPrimary
	tracedPool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tracedPool.Close)
	var inRecovery bool
	if err := readPool.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil || !inRecovery {
		t.Fatalf("the read pool is not on a standby: in recovery %v, %v", inRecovery, err)
	}

	headOf := func(pool *pgxpool.Pool) int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(global_sequence), 0) FROM annals.events`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	caughtUp := func(pos int64) {
		t.Helper()
		annalstest.WaitFor(t, 2*time.Minute, func() bool { return headOf(readPool) >= pos })
	}
	pause := func() {
		t.Helper()
		if _, err := readPool.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
			t.Fatal(err)
		}
		annalstest.WaitFor(t, 10*time.Second, func() bool {
			var state string
			_ = readPool.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state)
			return state == "paused"
		})
	}
	resume := func() {
		t.Helper()
		if _, err := readPool.Exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
			t.Fatal(err)
		}
	}
	// rebuilder is a runner of version that reads from the replica, on the
	// traced pool, with the cut-over's settings of bg if given.
	rebuilder := func(id string, version int, bg ...projection.BlueGreen) *projection.Runner {
		t.Helper()
		var cfg projection.BlueGreen
		if len(bg) > 0 {
			cfg = bg[0]
		}
		cfg.Version, cfg.CheckInterval = version, 100*time.Millisecond
		r, err := projection.NewRunner(tracedPool, &projection.Config{
			InstanceID: id, PollInterval: 100 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
			ShutdownTimeout: 5 * time.Second, ReadPool: readPool,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(statsProjection(version), &projection.Options{BlueGreen: &cfg}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	checkpointOf := func(sub string) int64 {
		var pos int64
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce(min(position), 0) FROM annals.checkpoints WHERE subscriber_id = $1`, sub).Scan(&pos); err != nil {
			t.Fatal(err)
		}
		return pos
	}

	// Generation 1 (version 1), live, caught up with 300 events.
	v1 := bgRunner(t, db, "v1", 1, false)
	if err := v1.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := log.add(ctx, 30, 10); err != nil {
		t.Fatal(err)
	}
	if err := v1.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}

	ok := t.Run("replays from the replica", func(t *testing.T) {
		caughtUp(300)
		onReplica.take()
		onPrimary.take()
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		c, err := rebuilder("v2", 2).RebuildBlueGreen(rctx, bgName, &projection.RebuildOptions{BatchSize: 20})
		if err != nil {
			t.Fatal(err)
		}
		if c.From != 1 || c.To != 2 {
			t.Fatalf("cut-over: %+v", c)
		}
		fromReplica, fromPrimary := onReplica.take(), onPrimary.take()
		t.Logf("events read: %d from the replica, %d from the primary", fromReplica, fromPrimary)
		if fromReplica < 300 || fromPrimary != 0 {
			t.Fatalf("the replay read %d events from the replica and %d from the primary; want all 300 from the replica, "+
				"none from the primary", fromReplica, fromPrimary)
		}
		if pos := exactAt(t, db, "rm_bgstats_g2.stats", "bgstats#g2", 2); pos != 300 {
			t.Fatalf("generation 2 is at %d, want 300", pos)
		}
	})
	if !ok {
		return
	}

	ok = t.Run("replica lags during the replay", func(t *testing.T) {
		stopLive := bgRunInBackground(t, bgRunner(t, db, "v2-live", 2, false)) // follows the primary
		defer stopLive()
		if err := log.add(ctx, 30, 10); err != nil {
			t.Fatal(err)
		}
		caughtUp(600)
		onReplica.take()
		onPrimary.take()
		var (
			mu              sync.Mutex
			paused, resumed bool
			lagged          int64 // the replica's head while paused, after the appends
			pauseErr        error
		)
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		c, err := rebuilder("v3", 3).RebuildBlueGreen(rctx, bgName, &projection.RebuildOptions{BatchSize: 20,
			OnProgress: func(p projection.RebuildProgress) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case !paused && p.Done > 0:
					// The replay has begun from the replica: pause its
					// replay and append 200 more events on the primary.
					paused = true
					if _, err := readPool.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
						pauseErr = err
						return
					}
					for {
						var state string
						if err := readPool.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state); err != nil {
							pauseErr = err
							return
						}
						if state == "paused" {
							break
						}
						time.Sleep(10 * time.Millisecond) // polling the replica's state; the test's deadline bounds it
					}
					if pauseErr = log.add(ctx, 20, 10); pauseErr != nil {
						return
					}
					lagged = headOf(readPool)
				case paused && !resumed && p.Done >= 600:
					// Through what the replica showed: let it replay again.
					resumed = true
					_, pauseErr = readPool.Exec(ctx, `SELECT pg_wal_replay_resume()`)
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if pauseErr != nil || !paused || !resumed {
			t.Fatalf("paused %v, resumed %v: %v", paused, resumed, pauseErr)
		}
		if lagged != 600 {
			t.Fatalf("the paused replica showed %d events, want 600 (the primary has 800)", lagged)
		}
		fromReplica, fromPrimary := onReplica.take(), onPrimary.take()
		t.Logf("cut-over %+v; events read: %d from the replica, %d from the primary", c, fromReplica, fromPrimary)
		if c.From != 2 || c.To != 3 {
			t.Fatalf("cut-over: %+v", c)
		}
		if fromReplica < 600 {
			t.Fatalf("%d events read from the replica, want at least the 600 it showed before the pause", fromReplica)
		}
		// Every event through the cut-over's position exactly once, and
		// the rest after it, from the runners of version 3.
		if pos := exactAt(t, db, "rm_bgstats_g3.stats", "bgstats#g3", 3); pos < c.FromPosition || pos != c.ToPosition {
			t.Fatalf("generation 3 is at %d; cut-over %+v", pos, c)
		}
		stopLive()
		caughtUp(800)
		if err := rebuilder("v3-catch-up", 3).RunUntilCaughtUp(ctx); err != nil {
			t.Fatal(err)
		}
		if pos := exactAt(t, db, "public.stats", "bgstats#g3", 3); pos != 800 {
			t.Fatalf("generation 3 is at %d after catching up, want 800", pos)
		}
	})
	if !ok {
		return
	}

	t.Run("replica far behind at the cut-over", func(t *testing.T) {
		bgRunInBackground(t, bgRunner(t, db, "v3-live", 3, false)) // follows the primary
		caughtUp(800)
		pause()
		defer resume()
		// Far more than the cut-over can replay within its lock timeout
		// (below): the primary's half of the rounds before it must.
		if err := log.add(ctx, 600, 10); err != nil {
			t.Fatal(err)
		}
		annalstest.WaitFor(t, 2*time.Minute, func() bool { return checkpointOf("bgstats#g3") >= 6800 })
		if n := headOf(readPool); n != 800 {
			t.Fatalf("the paused replica shows %d events, want 800", n)
		}
		// A writer appends while the rebuild runs (the live generation
		// follows on the primary; the replica shows none of it).
		wctx, stopWriter := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var writeErr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			for wctx.Err() == nil {
				if err := log.add(wctx, 1, 5); err != nil && wctx.Err() == nil {
					writeErr = err
					return
				}
				time.Sleep(100 * time.Millisecond) // the writer's pace, not a wait for a condition
			}
		}()
		onReplica.take()
		onPrimary.take()
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		// One attempt, 300ms to replay what is left while the live
		// generation is held: the 6000 events the replica lacks must have
		// been replayed from the primary before the cut-over, not by it.
		// The writer stops once the rebuild has replayed them, so that
		// what is left at the cut-over is a few events even on a loaded
		// machine (where its events since the last round could miss the
		// window), and never the 6000.
		c, err := rebuilder("v4", 4, projection.BlueGreen{CutoverLockTimeout: 300 * time.Millisecond, CutoverAttempts: 1}).
			RebuildBlueGreen(rctx, bgName, &projection.RebuildOptions{BatchSize: 20, OnProgress: func(p projection.RebuildProgress) {
				if p.Done >= 6800 {
					stopWriter()
				}
			}})
		stopWriter()
		wg.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if writeErr != nil {
			t.Fatal(writeErr)
		}
		fromReplica, fromPrimary := onReplica.take(), onPrimary.take()
		t.Logf("cut-over %+v; events read: %d from the replica, %d from the primary", c, fromReplica, fromPrimary)
		if c.From != 3 || c.To != 4 || c.FromPosition < 6800 || c.Attempts != 1 {
			t.Fatalf("cut-over: %+v", c)
		}
		if n := headOf(readPool); n != 800 {
			t.Fatalf("the replica shows %d events at the end, want 800: it was not paused throughout", n)
		}
		if fromReplica < 800 || fromPrimary < 6000 {
			t.Fatalf("%d events read from the replica and %d from the primary: want the 800 the replica shows from it, "+
				"the rest (at least 6000) from the primary", fromReplica, fromPrimary)
		}
		if pos := exactAt(t, db, "rm_bgstats_g4.stats", "bgstats#g4", 4); pos < 6800 || pos != c.ToPosition {
			t.Fatalf("generation 4 is at %d, want the cut-over's %d, at least 6800; cut-over %+v", pos, c.ToPosition, c)
		}
	})
}

// TestBlueGreenReadPoolGoneMidReplay: the ReadPool (here a second pool on
// the primary, standing for a caught-up replica) goes away while the first
// round replays from it. The primary still has every event: the rebuild
// finishes from it rather than retry the dead replica until ctx ends.
func TestBlueGreenReadPoolGoneMidReplay(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 40, 10)
	readPool, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(readPool.Close)
	r, err := projection.NewRunner(db.Pool, &projection.Config{
		InstanceID: "v2", PollInterval: 100 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second, ReadPool: readPool,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(statsProjection(2), &projection.Options{BlueGreen: &projection.BlueGreen{
		Version: 2, CheckInterval: 100 * time.Millisecond,
	}}); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := r.RebuildBlueGreen(rctx, bgName, &projection.RebuildOptions{BatchSize: 20,
		OnProgress: func(p projection.RebuildProgress) {
			if p.Done > 0 {
				once.Do(func() { go readPool.Close() }) // the replica goes away mid-replay
			}
		}})
	if err != nil {
		t.Fatalf("replica gone mid-replay, primary fine: the rebuild did not finish: %v", err)
	}
	if pos := exactAt(t, db, "rm_bgstats_g2.stats", "bgstats#g2", 2); pos != 400 {
		t.Fatalf("generation 2 at %d, want 400; %+v", pos, c)
	}
}
