package cli

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/lockkey"
)

// TestStatusSaysNoLiveInstanceHoldsTheLock: a runner that took ticks/0's
// lock through a transaction-mode PgBouncer stopped (deregistered: no
// instance row) and left the lock on the pooler's server session. status
// named it as ticks/0's leader, "gone-runner (lock held by backend PID)",
// as if it led. Now the LEADER cell says that no live instance holds it, a
// NO LIVE INSTANCE line names the backend and the remedy, and the JSON says
// no_live_instance; a partition a live instance lists, and a rebuild's,
// get no such line.
func TestStatusSaysNoLiveInstanceHoldsTheLock(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	sqlExec(t, db, `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner) VALUES
		('ticks', 0, 0, 5, 'gone-runner'), ('ticks', 1, 0, 3, 'live'), ('ticks', 2, 0, 7, 'rebuild:ops')`)
	sqlExec(t, db, `INSERT INTO annals.instances (instance_id, host, pid, last_heartbeat, leads) VALUES
		('live', 'vm', 1, now(), '[{"subscriber": "ticks", "partition": 1, "epoch": 3}]')`)
	conn, err := pgx.Connect(t.Context(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(t.Context()) })
	for p := range 3 {
		k1, k2 := lockkey.Pair(catchup.LockKey("annals", "ticks", p))
		if _, err := conn.Exec(t.Context(), "SELECT pg_advisory_lock($1::int4, $2::int4)", k1, k2); err != nil {
			t.Fatal(err)
		}
	}
	pid := conn.PgConn().PID()

	r := annals(t, db.URL, "status")
	if r.code != 0 {
		t.Fatalf("status: %+v", r)
	}
	if l := tableLine(t, r.stdout, "ticks", "0"); !strings.HasSuffix(l, fmt.Sprintf(" 5 gone-runner (lock held by backend %d, no live instance)", pid)) {
		t.Errorf("ticks/0: %q", l)
	}
	if l := tableLine(t, r.stdout, "ticks", "1"); !strings.HasSuffix(l, " 3 live") {
		t.Errorf("ticks/1: %q", l)
	}
	if l := tableLine(t, r.stdout, "ticks", "2"); !strings.HasSuffix(l, fmt.Sprintf(" 7 rebuild:ops (lock held by backend %d)", pid)) {
		t.Errorf("ticks/2: %q", l)
	}
	note := tableLine(t, r.stdout, "NO", "LIVE", "INSTANCE", "ticks/0:")
	for _, want := range []string{fmt.Sprintf("held by backend %d (last claimed by gone-runner)", pid),
		fmt.Sprintf("pg_terminate_backend(%d)", pid), "RECONNECT"} {
		if !strings.Contains(note, want) {
			t.Errorf("the NO LIVE INSTANCE line lacks %q: %s", want, note)
		}
	}
	if n := strings.Count(r.stdout, "NO LIVE INSTANCE"); n != 1 {
		t.Errorf("%d NO LIVE INSTANCE lines; want 1 (not for a live instance's, nor a rebuild's):\n%s", n, r.stdout)
	}

	st := statusJSON(t, db.URL)
	for _, s := range st.Subscribers {
		want := s.Partition != 1
		if s.NoLiveInstance != want || !s.LockHeld || s.LockPID == nil || *s.LockPID != int32(pid) {
			t.Errorf("ticks/%d: no_live_instance %v, lock_held %v, lock_pid %v; want no_live_instance %v", s.Partition, s.NoLiveInstance, s.LockHeld, s.LockPID, want)
		}
	}
	// leader keeps the rule the console and the projections commands apply
	// (package leadership): the last claimant, beside no_live_instance.
	if s := st.Subscribers[0]; s.Leader == nil || *s.Leader != "gone-runner" {
		t.Errorf("ticks/0 leader %v; want gone-runner", deref(s.Leader))
	}
}
