package projection_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/childproc"
	"github.com/annals-dev/annals/internal/pgcluster"
)

// Runners reach PostgreSQL through a real PgBouncer in session mode, the
// pooler setup docs/operations.md ("PgBouncer and other poolers") supports
// for them, with the lock session's start-up parameters on PgBouncer's
// ignore list (it refuses them otherwise). The leader is killed with
// SIGKILL, three times: PgBouncer sees its client gone and resets the server
// session (DISCARD ALL gives its advisory locks back), and the standby,
// also through PgBouncer, leads within takeoverLimit. Every event is applied
// exactly once.
func TestTakeoverThroughPgBouncerInSessionMode(t *testing.T) {
	t.Parallel()
	f := newFleet(t, childMode{Kind: kindProjection, BatchSize: 20})
	viaBouncer, _ := annalstest.PgBouncer(t, f.b.db.URL, &pgcluster.PgBouncerOptions{
		PoolMode: "session", PoolSize: 20, IgnoreStartupParameters: pgcluster.LockSessionParameters})
	start := func(id string) *childproc.Child {
		c := startChildAt(t, viaBouncer, id, f.mode)
		f.children = append(f.children, c)
		return c
	}

	f.appendEvents(200)
	leader := start("pgb0")
	f.waitLeader(leader, 20*time.Second)
	for r := range 3 {
		standby := start(fmt.Sprintf("pgb%d", r+1))
		f.waitRegistered(standby)
		f.appendEvents(100)
		before := f.checkpoint()
		killed := time.Now()
		leader.Kill()
		took, ok := eventually(takeoverLimit, func() bool {
			cp := f.checkpoint()
			return cp.Epoch > before.Epoch && cp.Owner == standby.ID
		})
		if !ok {
			h, held := f.holder()
			t.Fatalf("round %d: %s does not lead %v after SIGKILL of %s: checkpoint %s; lock holder %+v (held %v)",
				r+1, standby.ID, takeoverLimit, leader.ID, f.checkpoint(), h, held)
		}
		t.Logf("round %d: SIGKILL of %s at %s; %s leads after %v", r+1, leader.ID, killed.Format("15:04:05.000"), standby.ID, took.Round(time.Millisecond))
		leader = standby
	}
	f.appendEvents(100)
	f.checkExactlyOnce(f.waitCaughtUp(30 * time.Second).Position)
}
