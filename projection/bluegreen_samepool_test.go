package projection_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// samePoolRunner is a runner of the stats projection in parts partitions at
// version on pool (a pool of its own, as a process of its own has), which
// tries a cut-over 5 times, each bounded by 1 s.
func samePoolRunner(t *testing.T, pool *pgxpool.Pool, id string, version, parts int) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(pool, &projection.Config{
		InstanceID: id, PollInterval: 50 * time.Millisecond, RetryBackoff: 50 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(statsProjection(version), &projection.Options{Partitions: parts, BatchSize: 20, BlueGreen: &projection.BlueGreen{
		Version: version, CheckInterval: 100 * time.Millisecond, CutoverAttempts: 5, CutoverLockTimeout: time.Second,
	}}); err != nil {
		t.Fatal(err)
	}
	return r
}

// smallPool is a pool of maxConns connections: pgxpool's default on a
// machine of up to 4 cores.
func smallPool(t *testing.T, db *annalstest.DB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// checkpointsOf returns the checkpoint of each partition of sub.
func checkpointsOf(t *testing.T, db *annalstest.DB, sub string) map[int]int64 {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `SELECT partition, position FROM `+pgx.Identifier{db.Schema}.Sanitize()+
		`.checkpoints WHERE subscriber_id = $1`, sub)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int64{}
	var p int
	var pos int64
	if _, err := pgx.ForEachRow(rows, []any{&p, &pos}, func() error { out[p] = pos; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// exactThroughCheckpoints checks that a generation's table holds, per
// partition, exactly the events of the partition through its checkpoint,
// each once (with version's totals).
func exactThroughCheckpoints(t *testing.T, db *annalstest.DB, table, sub string, version, parts int) {
	t.Helper()
	ctx := t.Context()
	tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	schema := pgx.Identifier{db.Schema}.Sanitize()
	got, err := readStats(ctx, tx, table)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `SELECT e.stream_id, count(*), sum((e.data->>'v')::bigint)
		  FROM `+schema+`.events e
		  JOIN `+schema+`.checkpoints c ON c.subscriber_id = $1
		   AND c.partition = `+schema+`.stream_partition(e.stream_id, $2)
		 WHERE e.global_sequence <= c.position GROUP BY e.stream_id`, sub, parts)
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
	bad := 0
	for s, w := range want {
		if got[s] != w && bad < 5 {
			bad++
			t.Errorf("%s: stream %s is %+v, want %+v", table, s, got[s], w)
		}
	}
	for s, g := range got {
		if _, ok := want[s]; !ok && bad < 5 {
			bad++
			t.Errorf("%s: stream %s is %+v, want absent (past %s's checkpoint)", table, s, g, sub)
		}
	}
}

// A service (one pool of 4 connections, pgxpool's default on a machine of
// up to 4 cores) runs a 3-partition blue/green projection live and rebuilds
// it blue/green itself (Client.Runner().RebuildBlueGreen) while events are
// appended. The cut-over transaction used to lock the live generation's
// checkpoints and then catch the new generation up on pool connections,
// while the live generation's leaders, blocked on those rows, held every
// other connection of the pool: nothing moved again, the rebuild and the
// live read model stood still for good. The rebuild must cut over, the old
// generation stop exactly there, and both hold each event once.
func TestBlueGreenCutoverSharesPoolWithLiveLeaders(t *testing.T) {
	t.Parallel()
	cutoverBesideLiveLeaders(t, 1)
}

// As TestBlueGreenCutoverSharesPoolWithLiveLeaders, with a rebuild of
// version 2 by another Runner on the same pool, which runs nothing of the
// read model (so the version-1 service cannot cut over in its place): the
// rebuild's own cut-over must go through although the live generation's
// leaders on its pool have a batch ready at every attempt (they are held
// off the pool while the cut-over holds their checkpoints, not left to
// block on them, a connection each).
func TestBlueGreenCutoverOfNewVersionSharesPoolWithLiveLeaders(t *testing.T) {
	t.Parallel()
	cutoverBesideLiveLeaders(t, 2)
}

func cutoverBesideLiveLeaders(t *testing.T, version int) {
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	const parts = 3
	pool := smallPool(t, db, 4)
	r := samePoolRunner(t, pool, "svc", 1, parts)
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := log.add(ctx, 200, 20); err != nil {
		t.Fatal(err)
	}
	seeded := headOf(t, db)
	bgRunInBackground(t, r)
	stopWriter := appendSteadily(t, log, 5, 5*time.Millisecond)
	// The live generation is caught up with the seed and follows the writer.
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		cps := checkpointsOf(t, db, bgName+"#g1")
		for p := range parts {
			if cps[p] < seeded {
				return false
			}
		}
		return true
	})

	rebuilder := r
	if version != 1 {
		rebuilder = samePoolRunner(t, pool, "rebuild", version, parts)
	}
	const limit = 40 * time.Second
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	// What the backends do shortly before the limit, should it be reached.
	var mu sync.Mutex
	var seen string
	snapshot := time.AfterFunc(limit-5*time.Second, func() {
		rows, err := db.Pool.Query(ctx, `SELECT state || ' / ' || coalesce(wait_event_type, '-') || ' / ' ||
			regexp_replace(left(query, 60), '\s+', ' ', 'g') FROM pg_stat_activity
			WHERE datname = current_database() AND (state = 'idle in transaction' OR wait_event_type = 'Lock')`)
		if err != nil {
			return
		}
		ss, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		mu.Lock()
		seen = fmt.Sprintf("%q", ss)
		mu.Unlock()
	})
	defer snapshot.Stop()
	c, err := rebuilder.RebuildBlueGreen(rctx, bgName, &projection.RebuildOptions{BatchSize: 100})
	if err != nil {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the blue/green rebuild of version %d beside the live generation on one pool of 4 did not cut over within %v: %v; "+
			"the backends in a transaction or waiting for a lock %v in: %s", version, limit, err, limit-5*time.Second, seen)
	}
	t.Logf("cut-over %+v", c)
	// The rebuild's cut-over, or (version 1) the service's own of the same
	// generation, which it runs too, if it came first.
	g2 := generation(t, db, 2)
	if c.To != 2 || g2.State != projection.GenerationLive || g2.Replaced == nil || *g2.Replaced != 1 || g2.CutoverPosition == nil {
		t.Fatalf("cut over to %d; generation 2 is %+v, want live, replacing generation 1", c.To, g2)
	}
	if version != 1 && c.From != 1 {
		t.Fatalf("cut over from %d, want 1", c.From)
	}
	stoppedAt := *g2.CutoverPosition
	if c.From == 1 {
		stoppedAt = c.FromPosition
	}
	stopWriter()
	head := headOf(t, db)
	if version != 1 {
		bgRunInBackground(t, rebuilder) // runs generation 2, live
	}
	// The new generation, live, follows the log to its head; the old one
	// stopped where the cut-over found it.
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		cps := checkpointsOf(t, db, bgName+"#g2")
		for p := range parts {
			if cps[p] < head {
				return false
			}
		}
		return true
	})
	for p, pos := range checkpointsOf(t, db, bgName+"#g1") {
		if pos > stoppedAt {
			t.Errorf("generation 1 partition %d moved on to %d after the cut-over at %d", p, pos, stoppedAt)
		}
	}
	exactThroughCheckpoints(t, db, "rm_bgstats_g1.stats", bgName+"#g1", 1, parts)
	exactThroughCheckpoints(t, db, "rm_bgstats_g2.stats", bgName+"#g2", version, parts)
	readerSees(t, db, log, version)
}
