package projection_test

import (
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// rollbackSequence builds g1 (version 1, live), cuts over to g2 (version
// 2), rolls back to g1 and cuts over from g1 to g3 (version 2 again), with
// a runner of version 1 running throughout. It returns with g3 live.
func rollbackSequence(t *testing.T, db *annalstest.DB, log *bgLog) {
	t.Helper()
	ctx := t.Context()
	seedV1(t, db, log, 20, 10)
	bgRunInBackground(t, bgRunner(t, db, "v1", 1, false))
	v2 := bgRunner(t, db, "v2", 2, false)
	c, err := v2.RebuildBlueGreen(ctx, bgName, nil)
	if err != nil || c.From != 1 || c.To != 2 {
		t.Fatalf("cut-over to g2: %+v %v", c, err)
	}
	rb, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName)
	if err != nil || rb.From != 2 || rb.To != 1 {
		t.Fatalf("rollback to g1: %+v %v", rb, err)
	}
	if err := log.add(ctx, 3, 2); err != nil {
		t.Fatal(err)
	}
	c, err = v2.RebuildBlueGreen(ctx, bgName, nil)
	if err != nil || c.From != 1 || c.To != 3 {
		t.Fatalf("cut-over to g3: %+v %v", c, err)
	}
}

func replacedOf(t *testing.T, db *annalstest.DB, gen int) int {
	t.Helper()
	g := generation(t, db, gen)
	if g.Replaced == nil {
		return 0
	}
	return *g.Replaced
}

// TestRollbackGoesToWhatTheCutoverReplaced: after g1 → g2, a rollback to g1
// and g3 cut over from g1, a rollback goes back to g1 (what g3 replaced),
// not to g2, the generation rolled back from; and from g1, which replaced
// nothing, there is no rollback.
func TestRollbackGoesToWhatTheCutoverReplaced(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	rollbackSequence(t, db, log)
	for gen, want := range map[int]int{1: 0, 2: 1, 3: 1} {
		if got := replacedOf(t, db, gen); got != want {
			t.Errorf("generation %d replaced %d, want %d", gen, got, want)
		}
	}
	rb, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName)
	if err != nil {
		t.Fatal(err)
	}
	if rb.From != 3 || rb.To != 1 {
		t.Fatalf("rollback went %d -> %d, want 3 -> 1", rb.From, rb.To)
	}
	for gen, want := range map[int]projection.GenerationState{1: projection.GenerationLive,
		2: projection.GenerationRetired, 3: projection.GenerationRetired} {
		if got := state(t, db, gen); got != want {
			t.Errorf("generation %d is %s, want %s", gen, got, want)
		}
	}
	// The rollback left what g1 replaced (nothing) as it was.
	if got := replacedOf(t, db, 1); got != 0 {
		t.Errorf("after the rollback generation 1 replaced %d, want none", got)
	}
	if _, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName); !errors.Is(err, projection.ErrNoRollback) {
		t.Fatalf("rollback from g1: %v, want ErrNoRollback", err)
	}
	// Version 1's runner carries g1 on, and readers see version 1.
	if err := log.add(ctx, 3, 2); err != nil {
		t.Fatal(err)
	}
	head := headOf(t, db)
	annalstest.WaitFor(t, 20*time.Second, func() bool { return checkpointOf(t, db, "bgstats#g1") >= head })
	exactAt(t, db, "rm_bgstats_g1.stats", "bgstats#g1", 1)
	readerSees(t, db, log, 1)
}

// TestRollbackReplacedDropped: the generation the live one replaced was
// dropped; the rollback fails with ErrNoRollback and does not fall back to
// another retired generation.
func TestRollbackReplacedDropped(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	rollbackSequence(t, db, log)
	dropped, err := projection.DropRetired(ctx, db.Pool, db.Schema, bgName, 0)
	if err != nil || len(dropped) != 2 {
		t.Fatalf("drop retired: %v %v", dropped, err)
	}
	// g2 kept retired: only g1, which g3 replaced, is dropped.
	schema := pgx.Identifier{db.Schema}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `UPDATE `+schema+`.read_model_generations SET state = 'retired', dropped_at = NULL
		WHERE projection = $1 AND generation = 2`, bgName); err != nil {
		t.Fatal(err)
	}
	if _, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName); !errors.Is(err, projection.ErrNoRollback) {
		t.Fatalf("rollback with g1 dropped: %v, want ErrNoRollback", err)
	}
	if got := state(t, db, 3); got != projection.GenerationLive {
		t.Fatalf("generation 3 is %s after a refused rollback", got)
	}
}

// TestRollbackWithoutReplaced: a live generation cut over before migration
// 0030 (replaced NULL) rolls back by the earlier rule, to the retired
// generation with the highest number below it.
func TestRollbackWithoutReplaced(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	rollbackSequence(t, db, log)
	schema := pgx.Identifier{db.Schema}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `UPDATE `+schema+`.read_model_generations SET replaced = NULL WHERE projection = $1`, bgName); err != nil {
		t.Fatal(err)
	}
	rb, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName)
	if err != nil {
		t.Fatal(err)
	}
	if rb.From != 3 || rb.To != 2 {
		t.Fatalf("rollback went %d -> %d, want 3 -> 2 (the rule for generations without replaced)", rb.From, rb.To)
	}
}

// TestRollbackKeepsFirstLiveTime: a rollback that makes a generation live
// again keeps in LiveSince the time it first went live, and records the
// time it went live again in LiveAgain (the rollback overwrote LiveSince:
// g1 read as live since after g2, which replaced it). A generation that
// went live before migration 0039 recorded the first time (its
// first_live_since NULL) keeps the time it had the same way.
func TestRollbackKeepsFirstLiveTime(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	rollbackSequence(t, db, log) // g1 → g2, back to g1, g1 → g3
	g1, g2, g3 := generation(t, db, 1), generation(t, db, 2), generation(t, db, 3)
	if g1.LiveSince == nil || g2.LiveSince == nil || !g1.LiveSince.Before(*g2.LiveSince) {
		t.Fatalf("generation 1 first went live at %v, generation 2 at %v: want 1 before 2", g1.LiveSince, g2.LiveSince)
	}
	if g1.LiveAgain == nil || !g1.LiveAgain.After(*g2.LiveSince) || g3.LiveSince == nil || g1.LiveAgain.After(*g3.LiveSince) {
		t.Fatalf("generation 1 went live again at %v; want between generation 2's %v and generation 3's %v", g1.LiveAgain, g2.LiveSince, g3.LiveSince)
	}
	if g2.LiveAgain != nil || g3.LiveAgain != nil {
		t.Fatalf("generations 2 and 3, never live again, have LiveAgain %v and %v", g2.LiveAgain, g3.LiveAgain)
	}

	// As before migration 0039: the time g1 last went live is all there is.
	schema := pgx.Identifier{db.Schema}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `UPDATE `+schema+`.read_model_generations SET first_live_since = NULL WHERE projection = $1`, bgName); err != nil {
		t.Fatal(err)
	}
	old := generation(t, db, 1)
	if old.LiveSince == nil || !old.LiveSince.Equal(*g1.LiveAgain) || old.LiveAgain != nil {
		t.Fatalf("generation 1 without first_live_since: live since %v, again %v; want %v and none", old.LiveSince, old.LiveAgain, g1.LiveAgain)
	}
	if rb, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName); err != nil || rb.To != 1 {
		t.Fatalf("rollback to g1: %+v %v", rb, err)
	}
	g1 = generation(t, db, 1)
	if g1.LiveSince == nil || !g1.LiveSince.Equal(*old.LiveSince) || g1.LiveAgain == nil || !g1.LiveAgain.After(*g3.LiveSince) {
		t.Fatalf("generation 1 rolled back to again: live since %v, again %v; want %v and after %v", g1.LiveSince, g1.LiveAgain, old.LiveSince, g3.LiveSince)
	}
}

// TestRollbackFrom: a rollback retried after its answer was lost (here: run
// again) goes one step further down the chain with Rollback; RollbackFrom
// with the generation it rolled back from refuses with ErrNotLive and
// changes nothing.
func TestRollbackFrom(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	rollbackSequence(t, db, log) // g3 live, replaced g1
	if _, err := projection.RollbackFrom(ctx, db.Pool, db.Schema, bgName, 1); !errors.Is(err, projection.ErrNotLive) {
		t.Fatalf("rollback from g1 while g3 is live: %v, want ErrNotLive", err)
	}
	if _, err := projection.RollbackFrom(ctx, db.Pool, db.Schema, bgName, -1); err == nil {
		t.Fatal("rollback from generation -1 succeeded")
	}
	rb, err := projection.RollbackFrom(ctx, db.Pool, db.Schema, bgName, 3)
	if err != nil || rb.From != 3 || rb.To != 1 {
		t.Fatalf("rollback from g3: %+v %v", rb, err)
	}
	// The retry: g3 is retired now, so nothing happens.
	if _, err := projection.RollbackFrom(ctx, db.Pool, db.Schema, bgName, 3); !errors.Is(err, projection.ErrNotLive) {
		t.Fatalf("retried rollback from g3: %v, want ErrNotLive", err)
	}
	for gen, want := range map[int]projection.GenerationState{1: projection.GenerationLive,
		2: projection.GenerationRetired, 3: projection.GenerationRetired} {
		if got := state(t, db, gen); got != want {
			t.Errorf("generation %d is %s after the retried rollback, want %s", gen, got, want)
		}
	}
}
