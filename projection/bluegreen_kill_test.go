package projection_test

// SIGKILL tests of blue/green rebuilds: the rebuild runs in a child process
// (the test binary, re-executed) that is killed during the replay and during
// the cut-over transaction; the rebuild then continues from the new
// generation's checkpoints, readers never see anything but a complete
// generation, and every event is applied exactly once to each.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/childproc"
	"github.com/annals-dev/annals/projection"
)

// bgChildEnv holds a blue/green child's configuration (a JSON bgChildSpec).
const bgChildEnv = "ANNALS_BLUEGREEN_CHILD"

type bgChildSpec struct {
	URL      string `json:"url"`
	Instance string `json:"instance"`
	// BatchSize of the replay; CutoverLockTimeout of the cut-over.
	BatchSize          int           `json:"batch_size"`
	CutoverLockTimeout time.Duration `json:"cutover_lock_timeout"`
}

// runBlueGreenChild rebuilds bgstats to version 2 and exits: 0 when it has
// cut over.
func runBlueGreenChild(raw string) int {
	var spec bgChildSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "child: bad %s: %v\n", bgChildEnv, err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).
		With(slog.String("instance", spec.Instance))
	ctx, stop := childproc.Context(logger)
	defer stop()
	pool, err := childproc.Pool(ctx, spec.URL, spec.Instance)
	if err != nil {
		logger.Error("child: connect", slog.Any("error", err))
		return 1
	}
	defer pool.Close()
	r, err := projection.NewRunner(pool, &projection.Config{InstanceID: spec.Instance, Logger: logger, RetryBackoff: 100 * time.Millisecond})
	if err != nil {
		logger.Error("child: new runner", slog.Any("error", err))
		return 1
	}
	if err := r.Register(statsProjection(2), &projection.Options{BlueGreen: &projection.BlueGreen{
		Version: 2, CutoverLockTimeout: spec.CutoverLockTimeout,
	}}); err != nil {
		logger.Error("child: register", slog.Any("error", err))
		return 1
	}
	c, err := r.RebuildBlueGreen(ctx, bgName, &projection.RebuildOptions{BatchSize: spec.BatchSize})
	if err != nil {
		logger.Error("child: rebuild", slog.Any("error", err))
		return 1
	}
	logger.Info("child: cut over", slog.Int("to", c.To), slog.Duration("duration", c.Duration))
	return 0
}

func startBlueGreenChild(t *testing.T, db *annalstest.DB, id string, batch int, lockTimeout time.Duration) *childproc.Child {
	t.Helper()
	spec, err := json.Marshal(bgChildSpec{URL: db.URL, Instance: id, BatchSize: batch, CutoverLockTimeout: lockTimeout})
	if err != nil {
		t.Fatal(err)
	}
	return childproc.Start(t, id, bgChildEnv+"="+string(spec))
}

// seedV1 makes generation 1 of bgstats (version 1) live over a log of
// streams × per events, filled in bulk: its table and checkpoint are set
// from the log, as if version 1 had processed it.
func seedV1(t *testing.T, db *annalstest.DB, log *bgLog, streams, per int) {
	t.Helper()
	ctx := t.Context()
	if err := bgRunner(t, db, "v1-setup", 1, false).RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := log.add(ctx, streams, per); err != nil {
		t.Fatal(err)
	}
	schema := pgx.Identifier{db.Schema}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO rm_bgstats_g1.stats
		SELECT stream_id, count(*), sum((data->>'v')::bigint) FROM `+schema+`.events GROUP BY stream_id`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE `+schema+`.checkpoints SET position = (SELECT max(global_sequence) FROM `+
		schema+`.events) WHERE subscriber_id = 'bgstats#g1'`); err != nil {
		t.Fatal(err)
	}
}

// readerSees checks that the stable view holds a complete model of version.
func readerSees(t *testing.T, db *annalstest.DB, log *bgLog, version int) {
	t.Helper()
	m, err := readStats(t.Context(), db.Pool, "public.stats")
	if err != nil {
		t.Fatal(err)
	}
	v, _, err := verdict(m, log.lengths())
	if err != nil {
		t.Fatal(err)
	}
	if v != version {
		t.Fatalf("readers see version %d, want %d", v, version)
	}
}

func checkpointOf(t *testing.T, db *annalstest.DB, sub string) int64 {
	t.Helper()
	var pos int64
	if err := db.Pool.QueryRow(t.Context(), `SELECT coalesce(min(position), 0) FROM `+pgx.Identifier{db.Schema}.Sanitize()+
		`.checkpoints WHERE subscriber_id = $1`, sub).Scan(&pos); err != nil {
		t.Fatal(err)
	}
	return pos
}

// TestBlueGreenKilled kills the process running a blue/green rebuild with
// SIGKILL, first during the replay, then during the cut-over transaction
// (blocked on a reader's lock on the view), while version 1 keeps running
// live: each time nothing is half done (generation 2 stays building, readers
// see version 1), and the rebuild run again continues generation 2 from its
// checkpoint and cuts over. Both generations hold every event exactly once.
func TestBlueGreenKilled(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 100, 200) // 20,000 events
	bgRunInBackground(t, bgRunner(t, db, "v1", 1, false))

	// 1. Killed during the replay (small batches keep it busy).
	child := startBlueGreenChild(t, db, "bg-replay", 50, 2*time.Second)
	annalstest.WaitFor(t, 60*time.Second, func() bool { return checkpointOf(t, db, "bgstats#g2") >= 2000 || !child.Alive() })
	child.Kill()
	at := checkpointOf(t, db, "bgstats#g2")
	t.Logf("killed during the replay, generation 2 at %d of %d", at, headOf(t, db))
	if at >= headOf(t, db) {
		t.Fatalf("the replay was done before the kill (at %d)", at)
	}
	if s := state(t, db, 2); s != projection.GenerationBuilding {
		t.Fatalf("generation 2 is %s after the kill, want building", s)
	}
	if err := log.add(ctx, 5, 10); err != nil { // version 1 keeps following
		t.Fatal(err)
	}
	readerSees(t, db, log, 1)
	exactAt(t, db, "rm_bgstats_g2.stats", "bgstats#g2", 2)

	// 2. Killed during the cut-over: a reader holds the view in an open
	// transaction, so the cut-over's DROP VIEW waits; the child is killed
	// while it waits. Its transaction never commits.
	reader, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reader.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := reader.Exec(ctx, `SELECT count(*) FROM public.stats`); err != nil {
		t.Fatal(err)
	}
	child = startBlueGreenChild(t, db, "bg-cutover", 5000, time.Minute)
	annalstest.WaitForErr(t, 60*time.Second, func() error {
		var waiting bool
		err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'bg-cutover' AND wait_event_type = 'Lock' AND query LIKE '%read_model_swap_views%')`).Scan(&waiting)
		if err == nil && !waiting {
			if !child.Alive() {
				t.Fatalf("the child exited before its cut-over waited:\n%s", childproc.Tail(child.Log(), 4000))
			}
			err = fmt.Errorf("the cut-over is not waiting for the reader yet")
		}
		return err
	})
	child.Kill()
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The killed client's backend finishes the statement it waited in, finds
	// no client and rolls back.
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'bg-cutover'`).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%d backends of the killed child remain", n)
		}
		return nil
	})
	if s := state(t, db, 2); s != projection.GenerationBuilding {
		t.Fatalf("generation 2 is %s after the kill during the cut-over, want building", s)
	}
	if s := state(t, db, 1); s != projection.GenerationLive {
		t.Fatalf("generation 1 is %s after the kill during the cut-over, want live", s)
	}
	readerSees(t, db, log, 1)

	// 3. Run again: it continues generation 2 and cuts over.
	child = startBlueGreenChild(t, db, "bg-again", 5000, 2*time.Second)
	annalstest.WaitFor(t, 60*time.Second, func() bool { return !child.Alive() })
	if child.State() != "exited with status 0" {
		t.Fatalf("the rebuild run again failed:\n%s", childproc.Tail(child.Log(), 4000))
	}
	if s := state(t, db, 2); s != projection.GenerationLive {
		t.Fatalf("generation 2 is %s, want live", s)
	}
	readerSees(t, db, log, 2)
	annalstest.WaitFor(t, 10*time.Second, func() bool { return state(t, db, 1) == projection.GenerationRetired })
	exactAt(t, db, "rm_bgstats_g1.stats", "bgstats#g1", 1)
	exactAt(t, db, "rm_bgstats_g2.stats", "bgstats#g2", 2)
}
