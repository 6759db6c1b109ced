package projection_test

import (
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/projection"
)

// TestReadReplicaBehindIsLogged: a runner reading from a streaming replica
// whose WAL replay is paused waits for it; it says so (an operator's trial
// found it waiting in silence while its lag grew): a WARN within a few
// seconds naming the subscriber, both heads and the paused replay, and an
// INFO once the replica has caught up after it resumed.
func TestReadReplicaBehindIsLogged(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cluster, h := clusterOfItsOwn(ctx, t)
	b := setupOn(t, &annalstest.DB{URL: cluster.URL(), Name: "postgres", Schema: "annals", Pool: h.pool})
	rng := rand.New(rand.NewPCG(7, 8))
	if _, err := appendEvents(ctx, b.store, rng, 10, nil); err != nil {
		t.Fatal(err)
	}
	replica, err := pgcluster.StartReplica(ctx, b.db.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Stop(t.Context()) })
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

	var logs annalstest.LogBuffer
	watch := &orderRecorder{}
	cfg := testConfig(time.Second)
	cfg.ReadPool = readPool
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r, err := projection.NewRunner(b.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(watch, &projection.Options{CheckpointEvery: 1}); err != nil {
		t.Fatal(err)
	}
	stop := runInBackground(t, r)
	defer stop()
	annalstest.WaitFor(t, 2*time.Minute, func() bool { return watch.count() == 10 })

	if _, err := readPool.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		var state string
		_ = readPool.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state)
		return state == "paused"
	})
	if _, err := appendEvents(ctx, b.store, rng, 5, nil); err != nil {
		t.Fatal(err)
	}
	const behind = "the read replica (ReadPool) is behind the primary"
	annalstest.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(logs.String(), behind) })
	var warn string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, behind) {
			warn = line
			break
		}
	}
	for _, want := range []string{"level=WARN", "subscriber=replica-watch", "replica_head=10", "primary_head=15",
		"behind_events=5", "replay_paused=true", "pg_wal_replay_resume()"} {
		if !strings.Contains(warn, want) {
			t.Errorf("the warning lacks %q:\n%s", want, warn)
		}
	}
	if n := watch.count(); n != 10 {
		t.Fatalf("%d events delivered while the replica's replay is paused at 10", n)
	}

	if _, err := readPool.Exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 2*time.Minute, func() bool { return watch.count() == 15 })
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		return strings.Contains(logs.String(), "the read replica (ReadPool) has caught up with the primary")
	})
	if n := strings.Count(logs.String(), behind); n != 1 {
		t.Errorf("the replica behind was logged %d times within a minute, want 1:\n%s", n, logs.String())
	}
}
