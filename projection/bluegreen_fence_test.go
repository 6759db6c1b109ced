package projection_test

import (
	"testing"
	"time"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/projection"
)

// A cut-over retires the old generation's checkpoints and announces the
// fence: the old fleet's leader, idle with a long poll (and a long
// blue/green check interval), lets the old generation's lock go at once
// instead of at its next poll.
func TestBlueGreenCutoverFencesAnIdleOldLeaderAtOnce(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	if err := log.add(ctx, 20, 5); err != nil {
		t.Fatal(err)
	}
	const slow = time.Minute
	old, err := projection.NewRunner(db.Pool, &projection.Config{InstanceID: "old", PollInterval: slow, ShutdownTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Register(statsProjection(1), &projection.Options{BlueGreen: &projection.BlueGreen{Version: 1, CheckInterval: slow}}); err != nil {
		t.Fatal(err)
	}
	bgRunInBackground(t, old)
	annalstest.WaitFor(t, 20*time.Second, func() bool { return state(t, db, 1) == projection.GenerationLive })
	gen1 := generation(t, db, 1)
	k1, k2 := advisorylock.Key(catchup.LockKey("", gen1.Subscriber, 0))
	held := func() bool {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid = ($1::int4::int8 & 4294967295)::oid AND objid = ($2::int4::int8 & 4294967295)::oid`, k1, k2).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		var pos int64
		_ = db.Pool.QueryRow(ctx, `SELECT coalesce(max(position), 0) FROM annals.checkpoints WHERE subscriber_id = $1`, gen1.Subscriber).Scan(&pos)
		return pos == 100 && held()
	})

	next := bgRunner(t, db, "next", 2, false)
	if _, err := next.RebuildBlueGreen(ctx, bgName, nil); err != nil {
		t.Fatalf("RebuildBlueGreen: %+v", err)
	}
	cut := time.Now()
	annalstest.WaitFor(t, 20*time.Second, func() bool { return !held() })
	d := time.Since(cut)
	t.Logf("the old generation's idle leader let go %v after the cut-over (poll %v)", d, slow)
	if d > 10*time.Second {
		t.Fatalf("the old generation's idle leader let go %v after the cut-over: it waited for its poll, not the fence's notice", d)
	}
}
