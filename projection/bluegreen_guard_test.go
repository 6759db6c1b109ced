package projection_test

// Tests of what RebuildBlueGreen and Rebuild refuse or report: a changed
// partition layout without a new BlueGreen.Version, RebuildOptions.NewLayout
// for a blue/green read model, two blue/green rebuilds at once, and a
// rebuild whose rebuild lock is lost.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/projection"
)

// bgRunnerParts is bgRunner with a partition count.
func bgRunnerParts(t *testing.T, db *annalstest.DB, id string, version, parts int) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(db.Pool, &projection.Config{
		InstanceID: id, PollInterval: 100 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(statsProjection(version), &projection.Options{Partitions: parts, BlueGreen: &projection.BlueGreen{
		Version: version, CheckInterval: 100 * time.Millisecond,
	}}); err != nil {
		t.Fatal(err)
	}
	return r
}

func generationCount(t *testing.T, db *annalstest.DB) int {
	t.Helper()
	gens, err := projection.ListGenerations(t.Context(), db.Pool, db.Schema, bgName)
	if err != nil {
		t.Fatal(err)
	}
	return len(gens)
}

// TestBlueGreenRebuildRefusesLayoutWithoutVersion: RebuildBlueGreen of the
// live generation's version with another partition count is refused, as Run
// refuses it, before it creates a generation (a generation of that version
// cut over with the new layout would refuse every instance still running
// the old one, and the live read model would stop). Its message, and Run's,
// name the blue/green remedy (a new BlueGreen.Version), not --new-layout;
// NewLayout itself is refused for a blue/green projection. The same layout
// still rebuilds.
func TestBlueGreenRebuildRefusesLayoutWithoutVersion(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 20, 10)

	checkLayoutErr := func(what string, err error) {
		t.Helper()
		var le *catchup.PartitionLayoutError
		if !errors.As(err, &le) || !errors.Is(err, catchup.ErrPartitionLayout) {
			t.Fatalf("%s: %v; want a *catchup.PartitionLayoutError", what, err)
		}
		if le.Subscriber != "bgstats#g1" || le.Partitions != 4 {
			t.Fatalf("%s: %+v", what, le)
		}
		msg := err.Error()
		if !strings.Contains(msg, "raise BlueGreen.Version (to 2)") || !strings.Contains(msg, "was built with 1 partition") ||
			!strings.Contains(msg, "asked for 4 partitions") || strings.Contains(msg, "new-layout") || strings.Contains(msg, "NewLayout") {
			t.Fatalf("%s: the error does not say how a blue/green read model changes its layout: %v", what, err)
		}
	}
	c, err := bgRunnerParts(t, db, "v1-p4", 1, 4).RebuildBlueGreen(ctx, bgName, nil)
	checkLayoutErr("RebuildBlueGreen", err)
	if c.To != 0 || generationCount(t, db) != 1 {
		t.Fatalf("the refused rebuild cut over to %d or created a generation (%d)", c.To, generationCount(t, db))
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	checkLayoutErr("Run", bgRunnerParts(t, db, "v1-p4-run", 1, 4).Run(rctx))

	_, err = bgRunnerParts(t, db, "v1-new-layout", 1, 1).RebuildBlueGreen(ctx, bgName, &projection.RebuildOptions{NewLayout: true})
	if err == nil || !strings.Contains(err.Error(), "blue/green projections change layout by raising BlueGreen.Version") {
		t.Fatalf("RebuildBlueGreen with NewLayout: %v; want it refused", err)
	}
	if n := generationCount(t, db); n != 1 {
		t.Fatalf("%d generations after the refused rebuilds; want 1", n)
	}

	// The layout it was built with rebuilds the same version.
	c, err = bgRunnerParts(t, db, "v1-p1", 1, 1).RebuildBlueGreen(ctx, bgName, nil)
	if err != nil || c.From != 1 || c.To != 2 {
		t.Fatalf("RebuildBlueGreen with the same layout: %+v %v", c, err)
	}
	// A new version takes the new layout.
	c, err = bgRunnerParts(t, db, "v2-p4", 2, 4).RebuildBlueGreen(ctx, bgName, nil)
	if err != nil || c.From != 2 || c.To != 3 {
		t.Fatalf("RebuildBlueGreen of version 2 with 4 partitions: %+v %v", c, err)
	}
	readerSees(t, db, log, 2)
}

// TestBlueGreenRebuildConcurrentRefused: a second RebuildBlueGreen of a
// projection while one runs fails at once with ErrRebuildRunning naming the
// projection, instead of fencing the first one's partitions halfway; the
// first cuts over.
func TestBlueGreenRebuildConcurrentRefused(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 50, 100) // 5,000 events

	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	var cut projection.Cutover
	go func() {
		var err error
		once := false
		cut, err = bgRunner(t, db, "v2-a", 2, false).RebuildBlueGreen(ctx, bgName, &projection.RebuildOptions{BatchSize: 100,
			OnProgress: func(projection.RebuildProgress) {
				if !once {
					once = true
					close(started)
					<-release // hold the first rebuild midway
				}
			}})
		first <- err
	}()
	select {
	case <-started:
	case err := <-first:
		t.Fatalf("the first rebuild ended before its first batch: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the first rebuild made no progress in 30s")
	}
	t0 := time.Now()
	_, err := bgRunner(t, db, "v2-b", 2, false).RebuildBlueGreen(ctx, bgName, &projection.RebuildOptions{LockTimeout: 30 * time.Second})
	close(release)
	if !errors.Is(err, projection.ErrRebuildRunning) || !strings.Contains(err.Error(), `"`+bgName+`"`) {
		t.Fatalf("second RebuildBlueGreen: %v; want ErrRebuildRunning naming %q", err, bgName)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("the second rebuild was refused after %s; want at once", d)
	}
	select {
	case err := <-first:
		if err != nil || cut.To != 2 {
			t.Fatalf("first RebuildBlueGreen: %+v %v", cut, err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the first rebuild did not end within 60s")
	}
	exactAt(t, db, "rm_bgstats_g2.stats", "bgstats#g2", 2)
	readerSees(t, db, log, 2)
}

// terminateLockHolder ends the session holding the advisory lock key.
func terminateLockHolder(t *testing.T, db *annalstest.DB, key string) {
	k1, k2 := advisorylock.Key(key)
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = ($1::int4::int8 & 4294967295)::oid
		  AND objid = ($2::int4::int8 & 4294967295)::oid AND objsubid = 2 AND granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, k1, k2).Scan(&n); err != nil {
		t.Error(err)
	} else if n != 1 {
		t.Errorf("%d sessions held the lock %q; want 1", n, key)
	}
}

// TestRebuildLostLockSaysSo: a rebuild (in place, and blue/green) whose
// rebuild lock session is terminated fails with an error whose message
// says that the rebuild lock was lost and why, not only the "context
// canceled" of the replay it stopped; both still match.
func TestRebuildLostLockSaysSo(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, err error) {
		t.Helper()
		if err == nil {
			t.Fatal("the rebuild succeeded; want it stopped by the lost lock")
		}
		msg := err.Error()
		if !strings.Contains(msg, "the rebuild lock was lost") || !strings.Contains(msg, "terminating connection") {
			t.Fatalf("the error does not say the rebuild lock was lost: %v", err)
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the error no longer matches the replay's cancellation: %v", err)
		}
	}
	t.Run("InPlace", func(t *testing.T) {
		h := newRBHarness(t)
		h.fill(3000, 100)
		const sub = "rb-lost-lock"
		r := h.rebuilder("rebuilder-l", &rbProjection{name: sub, writer: "rebuild"}, rbOptions)
		killed := false
		err := r.Rebuild(t.Context(), sub, &projection.RebuildOptions{BatchSize: 100, OnProgress: func(p projection.RebuildProgress) {
			if !killed && p.Done >= 500 {
				killed = true
				terminateLockHolder(t, h.db, projection.RebuildLockKey(h.db.Schema, sub))
			}
		}})
		check(t, err)
	})
	t.Run("BlueGreen", func(t *testing.T) {
		db := annalstest.NewDB(t, nil)
		log := &bgLog{db: db}
		seedV1(t, db, log, 30, 100)
		killed := false
		_, err := bgRunner(t, db, "v2-l", 2, false).RebuildBlueGreen(t.Context(), bgName, &projection.RebuildOptions{BatchSize: 100,
			OnProgress: func(p projection.RebuildProgress) {
				if !killed && p.Done >= 500 {
					killed = true
					terminateLockHolder(t, db, projection.RebuildLockKey(db.Schema, bgName))
				}
			}})
		check(t, err)
	})
}

// TestBlueGreenResumedProgress: a blue/green rebuild that continues an
// interrupted generation counts what its checkpoints passed as done, so its
// progress starts there and ends at 100% (Done == Total), with no ETA once
// finished.
func TestBlueGreenResumedProgress(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 40, 100) // 4,000 events
	r := bgRunner(t, db, "v2-p", 2, false)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if _, err := r.RebuildBlueGreen(cctx, bgName, &projection.RebuildOptions{BatchSize: 100, OnProgress: func(p projection.RebuildProgress) {
		if p.Done >= 2000 {
			cancel()
		}
	}}); err == nil {
		t.Fatal("the first rebuild was not interrupted")
	}
	resumeAt := checkpointOf(t, db, "bgstats#g2")
	if resumeAt < 2000 || resumeAt >= 4000 {
		t.Fatalf("generation 2 stopped at %d; want 2000..3999", resumeAt)
	}
	var first, last projection.RebuildProgress
	if _, err := r.RebuildBlueGreen(ctx, bgName, &projection.RebuildOptions{BatchSize: 100, OnProgress: func(p projection.RebuildProgress) {
		if first.Projection == "" {
			first = p
		}
		last = p
	}}); err != nil {
		t.Fatal(err)
	}
	if first.Done <= resumeAt || first.Total != 4000 {
		t.Errorf("the resumed rebuild's first progress %+v; want Done past the %d replayed before, of 4000", first, resumeAt)
	}
	if !last.Finished || last.Done != last.Total || last.Total != 4000 || last.ETA != 0 {
		t.Errorf("the resumed rebuild's last progress %+v; want finished, Done == Total == 4000, no ETA", last)
	}
	exactAt(t, db, "rm_bgstats_g2.stats", "bgstats#g2", 2)
}
