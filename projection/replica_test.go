package projection_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/projection"
)

// orderRecorder is an observer that keeps every delivery in memory.
type orderRecorder struct {
	mu  sync.Mutex
	got []eventstore.Event
}

func (o *orderRecorder) Name() string { return "replica-watch" }

func (o *orderRecorder) Handle(_ context.Context, e eventstore.Event) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, e)
	return nil
}

func (o *orderRecorder) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.got)
}

// TestReadReplica runs a projection and an observer that read from a real
// streaming replica (pg_basebackup of a cluster of the test's own), while
// their locks, checkpoints and handler transactions stay on the primary.
// With the replica's replay paused, new events are not delivered (the
// replica shows the log as of the pause, a prefix); after it resumes, every
// event is delivered once and in order, and the projection equals the log.
// (A replica of the shared test cluster replays every other test's WAL too,
// databases created and dropped included: in make test it once took more
// than two minutes to reach the appends.)
func TestReadReplica(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cluster, h := clusterOfItsOwn(ctx, t)
	b := setupOn(t, &annalstest.DB{URL: cluster.URL(), Name: "postgres", Schema: "annals", Pool: h.pool})
	if _, err := b.db.Pool.Exec(ctx, `CREATE TABLE replica_counts (stream_id text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	if _, err := appendEvents(ctx, b.store, rng, 50, nil); err != nil {
		t.Fatal(err)
	}
	replica, err := pgcluster.StartReplica(ctx, b.db.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Stop(context.Background()) })
	pc, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Host, pc.ConnConfig.Port = "127.0.0.1", uint16(replica.Port())
	pc.ConnConfig.Fallbacks = nil
	readPool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer readPool.Close()
	var inRecovery bool
	if err := readPool.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil || !inRecovery {
		t.Fatalf("the read pool is not on a standby: in recovery %v, %v", inRecovery, err)
	}
	replicaCount := func() int64 {
		var n int64
		if err := readPool.QueryRow(ctx, `SELECT count(*) FROM annals.events`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	annalstest.WaitFor(t, 2*time.Minute, func() bool { return replicaCount() == 50 }) // replay of a busy cluster

	counter := projection.New("replica-count", b.reg)
	count := func(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO replica_counts VALUES ($1, 1) ON CONFLICT (stream_id) DO UPDATE SET n = replica_counts.n + 1`, e.StreamID)
		return err
	}
	projection.On(counter, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Deposited]) error {
		return count(ctx, tx, e.Event)
	})
	projection.On(counter, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Withdrawn]) error {
		return count(ctx, tx, e.Event)
	})
	watch := &orderRecorder{}
	cfg := testConfig(time.Second)
	cfg.ReadPool = readPool
	r, err := projection.NewRunner(b.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(counter, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(watch, &projection.Options{CheckpointEvery: 1}); err != nil {
		t.Fatal(err)
	}
	stop := runInBackground(t, r)
	defer stop()
	annalstest.WaitFor(t, time.Minute, func() bool { return watch.count() == 50 })

	// Pause the replica's replay and append 50 more on the primary.
	if _, err := readPool.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		var state string
		_ = readPool.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state)
		return state == "paused"
	})
	if _, err := appendEvents(ctx, b.store, rng, 50, nil); err != nil {
		t.Fatal(err)
	}
	// The events are committed on the primary (and announced): for a while
	// (several of the runner's 100 ms replica polls), nothing new arrives.
	window := time.Now().Add(700 * time.Millisecond)
	for time.Now().Before(window) {
		if n := watch.count(); n != 50 {
			t.Fatalf("%d events delivered while the replica's replay is paused at 50", n)
		}
		time.Sleep(10 * time.Millisecond) // the sampling period of a window in which nothing may happen
	}
	if n := replicaCount(); n != 50 {
		t.Fatalf("the paused replica shows %d events", n)
	}
	if _, err := readPool.Exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	// The replica replays the whole cluster's WAL, one record after another:
	// in make test, other tests create and drop databases (file copies on
	// the replica too), so it may take a while to reach the appends. Delivery
	// is measured from the moment it has.
	var primaryLSN string
	if err := b.db.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&primaryLSN); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 2*time.Minute, func() bool {
		var caughtUp bool
		err := readPool.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, primaryLSN).Scan(&caughtUp)
		return err == nil && caughtUp
	})
	replayed := time.Now()
	annalstest.WaitFor(t, 30*time.Second, func() bool { return watch.count() == 100 })
	t.Logf("the replica replayed the appends %v after it resumed; the 50 new events were delivered %v later",
		replayed.Sub(resumed).Round(time.Millisecond), time.Since(replayed).Round(time.Millisecond))
	var cp int64
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		_ = b.db.Pool.QueryRow(ctx, `SELECT position FROM annals.checkpoints WHERE subscriber_id = 'replica-count'`).Scan(&cp)
		return cp == 100
	})
	watch.mu.Lock()
	defer watch.mu.Unlock()
	for i, e := range watch.got {
		if e.GlobalSequence != int64(i+1) {
			t.Fatalf("delivery %d is event %d: not once and in order", i+1, e.GlobalSequence)
		}
	}
	var total int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM replica_counts`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if total != 100 {
		t.Fatalf("the projection (written on the primary) counted %d events, want 100", total)
	}
}
