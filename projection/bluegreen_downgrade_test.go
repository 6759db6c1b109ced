package projection_test

// A cut-over never moves readers back to an older version than the live
// generation's: a building generation of an older version (an interrupted
// rebuild, a straggling instance of an earlier deploy) is retired without
// going live, whoever tries to cut it over.

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// gatedStats is statsProjection(version) whose handler blocks until gate is
// closed or its context ends (a replay that cannot finish meanwhile).
func gatedStats(version int, gate <-chan struct{}) *projection.Typed {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Counted](reg, "bg.counted")
	p := projection.New(bgName, reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE stats (stream text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)`))
	bonus := int64(0)
	if version >= 2 {
		bonus = bgBonus
	}
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Counted]) error {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := tx.Exec(ctx, `INSERT INTO stats VALUES ($1, 1, $2)
			ON CONFLICT (stream) DO UPDATE SET n = stats.n + 1, total = stats.total + $2`, e.StreamID, e.Data.V+bonus)
		return err
	})
	return p
}

// gatedRebuild starts RebuildBlueGreen of version 2 with gatedStats in the
// background and waits until its generation (2) is building; its result
// comes on the channel returned.
func gatedRebuild(t *testing.T, ctx context.Context, db *annalstest.DB, gate <-chan struct{}) <-chan error {
	t.Helper()
	r, err := projection.NewRunner(db.Pool, &projection.Config{InstanceID: "v2-rebuild", RetryBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(gatedStats(2, gate), &projection.Options{BlueGreen: &projection.BlueGreen{
		Version: 2, CheckInterval: 100 * time.Millisecond,
	}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := r.RebuildBlueGreen(ctx, bgName, nil); done <- err }()
	annalstest.WaitFor(t, 30*time.Second, func() bool { return state(t, db, 2) == projection.GenerationBuilding })
	return done
}

// bgLoggedRunner is bgRunner with its log in logs.
func bgLoggedRunner(t *testing.T, db *annalstest.DB, id string, version int, auto bool, logs *annalstest.LogBuffer) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(db.Pool, &projection.Config{
		InstanceID: id, PollInterval: 100 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(logs, nil)),
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

// stoppedReason is the stop reason of a subscriber's checkpoints ("" for
// none) and their number.
func stoppedReason(t *testing.T, db *annalstest.DB, sub string) (string, int) {
	t.Helper()
	var reason string
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT coalesce(min(stopped_reason), ''), count(*) FROM `+pgx.Identifier{db.Schema}.Sanitize()+
		`.checkpoints WHERE subscriber_id = $1`, sub).Scan(&reason, &n); err != nil {
		t.Fatal(err)
	}
	return reason, n
}

// TestBlueGreenOlderVersionNeverCutsOverNewer: a rolling deploy of version
// 2 leaves a building generation of version 2 behind (its rebuild
// interrupted); version 3 is deployed with AutoRebuild and cuts over from
// generation 1 to 3. Then a straggling instance of version 2 with
// AutoRebuild starts (an old pod restarting during the roll-out): it must
// not cut over to its building generation 2 (readers would go back a
// version, and once it is gone nothing would update the live read model),
// but retire it, with a warning, and run nothing; version 3 keeps the read
// model up to date.
func TestBlueGreenOlderVersionNeverCutsOverNewer(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 20, 50)
	stopV1 := bgRunInBackground(t, bgRunner(t, db, "v1", 1, false))

	// Version 2's rebuild starts and is interrupted: generation 2 stays building.
	rctx, cancel := context.WithCancel(ctx)
	done := gatedRebuild(t, rctx, db, make(chan struct{}))
	cancel()
	t.Logf("version 2's rebuild interrupted: %v", <-done)

	// Version 3 deployed with AutoRebuild: generation 3 is built and cut over.
	bgRunInBackground(t, bgRunner(t, db, "v3", 3, true))
	annalstest.WaitFor(t, 60*time.Second, func() bool { return state(t, db, 3) == projection.GenerationLive })
	stopV1()

	// A straggling version-2 instance with AutoRebuild starts.
	var logs annalstest.LogBuffer
	stopV2 := bgRunInBackground(t, bgLoggedRunner(t, db, "v2-straggler", 2, true, &logs))
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		if st := state(t, db, 2); st == projection.GenerationLive {
			t.Fatalf("the version-2 instance cut over to generation 2 while generation 3 (version 3) was live: readers went back a version")
		} else if st != projection.GenerationRetired {
			return errors.Newf("generation 2 is %s", st)
		}
		if !strings.Contains(logs.String(), "runs no generation of the blue/green read model") {
			return errors.New("the version-2 instance has not said that it runs nothing")
		}
		return nil
	})
	stopV2()
	g2, g3 := generation(t, db, 2), generation(t, db, 3)
	if g2.LiveSince != nil || g3.State != projection.GenerationLive || g3.Version != 3 {
		t.Fatalf("generation 2: %+v; generation 3: %+v", g2, g3)
	}
	l := logs.String()
	for _, want := range []string{
		"a building generation of an older version than the live one was retired, not cut over",
		"the live generation is version 3, newer than this runner's",
	} {
		if !strings.Contains(l, want) {
			t.Fatalf("the version-2 instance's log lacks %q:\n%s", want, l)
		}
	}
	// (Its checkpoints exist if the interrupted rebuild got as far.)
	if r, n := stoppedReason(t, db, "bgstats#g2"); n > 0 && !strings.Contains(r, "retired before it went live") {
		t.Fatalf("generation 2's %d checkpoints: stop reason %q", n, r)
	}

	// Version 3 keeps the read model up to date.
	if err := log.add(ctx, 5, 10); err != nil {
		t.Fatal(err)
	}
	head := headOf(t, db)
	annalstest.WaitFor(t, 30*time.Second, func() bool { return checkpointOf(t, db, "bgstats#g3") >= head })
	readerSees(t, db, log, 2) // version 3 writes as version 2 does
	if pos := exactAt(t, db, "rm_bgstats_g3.stats", "bgstats#g3", 3); pos < head {
		t.Fatalf("generation 3 at %d, head %d", pos, head)
	}
}

// TestBlueGreenRebuildOfOlderVersionRefused: a RebuildBlueGreen of version
// 2 replays while version 3 (AutoRebuild) builds and cuts over first. When
// version 2's replay is done, its cut-over is refused inside the cut-over
// transaction with ErrCutoverOlderVersion and its generation retired, and
// a RebuildBlueGreen of version 2 started after that is refused at once,
// setting up nothing.
func TestBlueGreenRebuildOfOlderVersionRefused(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 20, 50)
	stopV1 := bgRunInBackground(t, bgRunner(t, db, "v1", 1, false))

	gate := make(chan struct{})
	done := gatedRebuild(t, ctx, db, gate)
	bgRunInBackground(t, bgRunner(t, db, "v3", 3, true))
	annalstest.WaitFor(t, 60*time.Second, func() bool { return state(t, db, 3) == projection.GenerationLive })
	stopV1()
	close(gate)
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("version 2's rebuild did not end within 60 s of its replay being let go")
	}
	if !errors.Is(err, projection.ErrCutoverOlderVersion) {
		t.Fatalf("version 2's rebuild with version 3 live: %v (generation 2 %s, generation 3 %s); want ErrCutoverOlderVersion",
			err, state(t, db, 2), state(t, db, 3))
	}
	t.Logf("version 2's rebuild: %v", err)
	if g2 := generation(t, db, 2); g2.State != projection.GenerationRetired || g2.LiveSince != nil {
		t.Fatalf("generation 2: %+v", g2)
	}
	if st := state(t, db, 3); st != projection.GenerationLive {
		t.Fatalf("generation 3 is %s", st)
	}
	if r, n := stoppedReason(t, db, "bgstats#g2"); n == 0 || !strings.Contains(r, "retired before it went live") {
		t.Fatalf("generation 2's %d checkpoints: stop reason %q", n, r)
	}

	_, err = bgRunner(t, db, "v2-again", 2, false).RebuildBlueGreen(ctx, bgName, nil)
	if !errors.Is(err, projection.ErrCutoverOlderVersion) {
		t.Fatalf("a new rebuild of version 2 with version 3 live: %v; want ErrCutoverOlderVersion", err)
	}
	gens, err := projection.ListGenerations(ctx, db.Pool, db.Schema, bgName)
	if err != nil {
		t.Fatal(err)
	}
	if len(gens) != 3 {
		t.Fatalf("%d generations after a refused rebuild, want 3: %+v", len(gens), gens)
	}

	// A rollback still goes back, on purpose, to what generation 3 replaced.
	rb, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName)
	if err != nil || rb.From != 3 || rb.To != 1 {
		t.Fatalf("rollback: %+v %v; want 3 -> 1", rb, err)
	}
}
