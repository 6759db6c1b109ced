package catchup_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
)

// nopProcessor does nothing; the tests append no events.
type nopProcessor struct{}

func (nopProcessor) Start(context.Context, *catchup.Lease) error { return nil }
func (nopProcessor) Process(_ context.Context, _ *catchup.Lease, b catchup.Batch) (int64, error) {
	return b.Through, nil
}
func (nopProcessor) Redeliver(context.Context, *catchup.Lease) error { return nil }
func (nopProcessor) Idle(context.Context, *catchup.Lease) error      { return nil }
func (nopProcessor) End(context.Context, *catchup.Lease) error       { return nil }

// instance is one engine with its own pool, whose sessions carry its name
// as application_name.
type instance struct {
	name   string
	pool   *pgxpool.Pool
	engine *catchup.Engine
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startInstance(t *testing.T, db *annalstest.DB, name string, cfg catchup.Config) *instance {
	t.Helper()
	return startInstanceWith(t, db, name, cfg, nil)
}

// startInstanceWith is startInstance whose pool's config edit changes first.
func startInstanceWith(t *testing.T, db *annalstest.DB, name string, cfg catchup.Config, edit func(*pgxpool.Config)) *instance {
	t.Helper()
	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = name
	if edit != nil {
		edit(pc)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), pc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Owner = name
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	e, err := catchup.NewEngine(pool, nil, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	in := &instance{name: name, pool: pool, engine: e}
	t.Cleanup(func() { in.stop(); pool.Close() })
	return in
}

// run drives partitions 0..n-1 of subscriber "s" until stop.
func (in *instance) run(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	for p := range n {
		in.wg.Add(1)
		go func() {
			defer in.wg.Done()
			sub := &catchup.Subscription{Name: "s", Partition: p, Partitions: n, Processor: nopProcessor{}}
			if err := in.engine.Run(ctx, sub); err != nil {
				t.Errorf("%s: Run(partition %d) = %v", in.name, p, err)
			}
		}()
	}
}

// stop ends the instance's runs gracefully and waits for them.
func (in *instance) stop() {
	if in.cancel != nil {
		in.cancel()
	}
	in.wg.Wait()
}

// owners returns the checkpoint owner and epoch of each partition of "s".
func owners(t *testing.T, db *annalstest.DB, n int) ([]string, []int64) {
	t.Helper()
	own, ep := make([]string, n), make([]int64, n)
	rows, err := db.Pool.Query(t.Context(), `SELECT partition, coalesce(owner, ''), epoch FROM annals.checkpoints WHERE subscriber_id = 's'`)
	if err != nil {
		t.Fatal(err)
	}
	var p int
	var o string
	var e int64
	if _, err := pgx.ForEachRow(rows, []any{&p, &o, &e}, func() error {
		if p < n {
			own[p], ep[p] = o, e
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return own, ep
}

// waitLeads waits until in owns every partition of "s" at an epoch above
// the one in after (nil: any).
func waitLeads(t *testing.T, db *annalstest.DB, in *instance, n int, after []int64, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	annalstest.WaitFor(t, timeout, func() bool {
		own, ep := owners(t, db, n)
		for p := range n {
			if own[p] != in.name || (after != nil && ep[p] <= after[p]) {
				return false
			}
		}
		return true
	})
	return time.Since(start)
}

// sessions counts the backends of in that are not its pool's. A pool
// connection being opened is counted by the pool before its backend shows
// in pg_stat_activity (or after): it counts only while none is.
func (in *instance) sessions(t *testing.T, db *annalstest.DB) int {
	t.Helper()
	var got int
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		before := in.pool.Stat()
		var n int
		if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, in.name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		after := in.pool.Stat()
		if before.ConstructingConns() != 0 || after.ConstructingConns() != 0 || before.TotalConns() != after.TotalConns() {
			return false
		}
		got = n - int(after.TotalConns())
		return true
	})
	return got
}

// standbySession waits until in has a standby session that has polled, and
// returns its backend.
func standbySession(t *testing.T, db *annalstest.DB, in *instance) int32 {
	t.Helper()
	var pid int32
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		err := db.Pool.QueryRow(t.Context(), `
			SELECT pid FROM pg_stat_activity
			 WHERE datname = current_database() AND application_name = $1 AND query LIKE '%unnest%pg_try_advisory_lock%' LIMIT 1`, in.name).Scan(&pid)
		return err == nil
	})
	return pid
}

// A process standing by for many partitions holds one connection for all
// of them, takes over every partition of a leader whose lock session dies,
// and then leads all of them on that one connection.
func TestStandbyOneSessionForAllPartitions(t *testing.T) {
	t.Parallel()
	const n = 6
	db := annalstest.NewDB(t, nil)
	// The leader, once its locks are gone, stays away: it cannot connect
	// again (its BeforeConnect refuses), and backs off for a minute.
	var refuse atomic.Bool
	a := startInstanceWith(t, db, "a", catchup.Config{RetryBackoff: time.Minute}, func(pc *pgxpool.Config) {
		pc.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
			if refuse.Load() {
				return errors.New("a may not connect again")
			}
			return nil
		}
	})
	a.run(t, n)
	waitLeads(t, db, a, n, nil, 10*time.Second)
	b := startInstance(t, db, "b", catchup.Config{})
	b.run(t, n)
	standbySession(t, db, b)
	for range 5 {
		if got := b.sessions(t, db); got != 1 {
			t.Fatalf("the standby of %d partitions has %d connections besides its pool, want 1", n, got)
		}
		time.Sleep(30 * time.Millisecond)
	}
	_, before := owners(t, db, n)
	refuse.Store(true)
	// a holds its n locks on one session: pg_terminate_backend of it frees
	// all of them at once, and b wins several locks in one poll.
	var killed int
	if err := db.Pool.QueryRow(t.Context(), `
		SELECT count(pg_terminate_backend(pid)) FROM (SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE a.datname = current_database() AND l.locktype = 'advisory' AND l.granted AND a.application_name = 'a') s`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d lock sessions of a (%v), want 1", killed, err)
	}
	d := waitLeads(t, db, b, n, before, 10*time.Second)
	t.Logf("b leads all %d partitions %v after a's lock sessions ended", n, d)
	// The standby session holds all n locks: one session holds every lock
	// of b, and b has no other connection besides its pool.
	for range 5 {
		var holders, locks int
		if err := db.Pool.QueryRow(t.Context(), `
			SELECT count(DISTINCT l.pid), count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			 WHERE a.datname = current_database() AND l.locktype = 'advisory' AND l.granted AND a.application_name = 'b'`).Scan(&holders, &locks); err != nil {
			t.Fatal(err)
		}
		if holders != 1 || locks != n {
			t.Fatalf("b holds %d locks on %d sessions, want %d on 1", locks, holders, n)
		}
		if got := b.sessions(t, db); got > 1 {
			t.Fatalf("the leader of %d partitions has %d connections besides its pool, want 1", n, got)
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// A leader that stops gracefully announces its release: the standby takes
// over at once, long before its next poll.
func TestGracefulHandoverIsAnnounced(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	a := startInstance(t, db, "a", catchup.Config{})
	a.run(t, 1)
	waitLeads(t, db, a, 1, nil, 10*time.Second)
	const poll = time.Minute
	b := startInstance(t, db, "b", catchup.Config{LockRetryInterval: poll})
	b.run(t, 1)
	standbySession(t, db, b) // it has made its first attempt; the next is ≥ 45s away
	_, before := owners(t, db, 1)
	start := time.Now()
	a.stop()
	stopped := time.Since(start)
	d := waitLeads(t, db, b, 1, before, 10*time.Second)
	t.Logf("a stopped in %v; b led %v later (its poll interval is %v)", stopped, d, poll)
}

// TakeOver queues for the lock, so a standby polling every millisecond
// cannot snatch the lock when the fenced leader lets go.
func TestTakeOverBeatsStandbys(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	a := startInstance(t, db, "a", catchup.Config{})
	a.run(t, 1)
	waitLeads(t, db, a, 1, nil, 10*time.Second)
	b := startInstance(t, db, "b", catchup.Config{LockRetryInterval: time.Millisecond})
	b.run(t, 1)
	standbySession(t, db, b)
	c := startInstance(t, db, "c", catchup.Config{})
	sub := &catchup.Subscription{Name: "s", Processor: nopProcessor{}}
	for round := range 3 {
		start := time.Now()
		lease, err := c.engine.TakeOver(t.Context(), sub, 10*time.Second)
		if err != nil {
			t.Fatalf("round %d: TakeOver: %+v", round, err)
		}
		own, ep := owners(t, db, 1)
		if own[0] != "c" || ep[0] != lease.Epoch {
			t.Fatalf("round %d: the checkpoint says owner %q at epoch %d; TakeOver's lease has epoch %d", round, own[0], ep[0], lease.Epoch)
		}
		t.Logf("round %d: TakeOver took %v", round, time.Since(start))
		// Nobody takes it from c while c holds it.
		time.Sleep(100 * time.Millisecond)
		if own, ep := owners(t, db, 1); own[0] != "c" || ep[0] != lease.Epoch {
			t.Fatalf("round %d: %q claimed epoch %d while c held the lease", round, own[0], ep[0])
		}
		c.engine.Release(t.Context(), lease)
		// A standby takes it back before the next round.
		annalstest.WaitFor(t, 10*time.Second, func() bool { own, _ := owners(t, db, 1); return own[0] != "c" })
	}
}

// CatchUp stands by like Run: with the lock held elsewhere it waits, and it
// fails with ctx's error when ctx ends first.
func TestCatchUpWaitsForTheLock(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	a := startInstance(t, db, "a", catchup.Config{})
	a.run(t, 1)
	waitLeads(t, db, a, 1, nil, 10*time.Second)
	b := startInstance(t, db, "b", catchup.Config{})
	sub := &catchup.Subscription{Name: "s", Processor: nopProcessor{}}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := b.engine.CatchUp(ctx, sub, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("CatchUp while another leads = %v, want DeadlineExceeded", err)
	}
	annalstest.WaitFor(t, 5*time.Second, func() bool { return b.sessions(t, db) == 0 })
	done := make(chan error, 1)
	go func() { done <- b.engine.CatchUp(t.Context(), sub, 0) }()
	time.Sleep(100 * time.Millisecond)
	a.stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("CatchUp after the leader stopped = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("CatchUp still waits 10s after the leader stopped")
	}
}
