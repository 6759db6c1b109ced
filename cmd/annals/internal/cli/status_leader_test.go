package cli

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/lockkey"
)

// TestStatusLeaderAfterKills: after a leader's process is killed (its lock
// session ended while its heartbeat is still fresh), after another instance
// takes a partition over (before its heartbeat lists it), and for a stopped
// process (heartbeat stale, lock session alive), the JSON leader is the
// table's LEADER, and the instance table shows no partition as led by two
// instances. The JSON leader came from the heartbeats alone (the killed
// instance, none for the stopped one), and the killed instance was live,
// leading its partitions, for --stale-after.
func TestStatusLeaderAfterKills(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)

	// Three runner processes of "ticks" with 4 partitions: a leads 0 and 1,
	// b leads 2, c leads 3; each holds its locks on its own session.
	sqlExec(t, db, `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner) VALUES
		('ticks', 0, 0, 5, 'a'), ('ticks', 1, 0, 5, 'a'), ('ticks', 2, 0, 3, 'b'), ('ticks', 3, 0, 4, 'c')`)
	sqlExec(t, db, `INSERT INTO annals.instances (instance_id, host, pid, last_heartbeat, leads) VALUES
		('a', 'vm', 1, now(), '[{"subscriber": "ticks", "partition": 0, "epoch": 5}, {"subscriber": "ticks", "partition": 1, "epoch": 5}]'),
		('b', 'vm', 2, now(), '[{"subscriber": "ticks", "partition": 2, "epoch": 3}]'),
		('c', 'vm', 3, now(), '[{"subscriber": "ticks", "partition": 3, "epoch": 4}]')`)
	session := func(parts ...int) (*pgx.Conn, uint32) {
		t.Helper()
		conn, err := pgx.Connect(t.Context(), db.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(t.Context()) })
		for _, p := range parts {
			k1, k2 := lockkey.Pair(catchup.LockKey("annals", "ticks", p))
			if _, err := conn.Exec(t.Context(), "SELECT pg_advisory_lock($1::int4, $2::int4)", k1, k2); err != nil {
				t.Fatal(err)
			}
		}
		return conn, conn.PgConn().PID()
	}
	_, pidA := session(0, 1)
	connB, _ := session(2)
	_, pidC := session(3)

	// agree checks that each partition's JSON leader is its LEADER cell's
	// instance, and returns the table and the JSON.
	agree := func(t *testing.T) (string, StatusJSON) {
		t.Helper()
		r := annals(t, db.URL, "status")
		if r.code != 0 {
			t.Fatalf("status: %+v", r)
		}
		st := statusJSON(t, db.URL)
		for _, s := range st.Subscribers {
			cells := strings.Fields(tableLine(t, r.stdout, s.Subscriber, strconv.Itoa(s.Partition)))
			cell := strings.Join(cells[8:], " ")
			if (s.Leader == nil && !strings.HasPrefix(cell, "(")) || (s.Leader != nil && !strings.HasPrefix(cell, *s.Leader+" ") && cell != *s.Leader) {
				t.Errorf("%s/%d: LEADER %q, JSON leader %v", s.Subscriber, s.Partition, cell, deref(s.Leader))
			}
		}
		return r.stdout, st
	}
	instance := func(st StatusJSON, id string) InstanceStatus {
		for _, in := range st.Instances {
			if in.InstanceID == id {
				return in
			}
		}
		t.Fatalf("no instance %s in %+v", id, st.Instances)
		return InstanceStatus{}
	}

	t.Run("Killed", func(t *testing.T) {
		// kill -9 of a: its session ends, its heartbeat stays fresh.
		var ok bool
		if err := db.Pool.QueryRow(t.Context(), "SELECT pg_terminate_backend($1::int, 10000)", pidA).Scan(&ok); err != nil || !ok {
			t.Fatalf("terminate a's session: %v %v", ok, err)
		}
		out, st := agree(t)
		for _, p := range []string{"0", "1"} {
			if l := tableLine(t, out, "ticks", p); !strings.HasSuffix(l, " (none: a's lock is free)") {
				t.Errorf("ticks/%s: %q", p, l)
			}
		}
		if s := st.Subscribers[0]; s.Leader != nil || s.LeaderEpoch != nil || s.LockHeld ||
			s.HeartbeatLeader == nil || *s.HeartbeatLeader != "a" || s.HeartbeatLeaderEpoch == nil || *s.HeartbeatLeaderEpoch != 5 {
			t.Errorf("ticks/0 JSON: %+v", s)
		}
		if l := tableLine(t, out, "a", "vm", "1"); !strings.HasSuffix(l, " lost - (listed, not held: ticks/0, ticks/1)") {
			t.Errorf("instance a: %q", l)
		}
		if l := tableLine(t, out, "b", "vm", "2"); !strings.HasSuffix(l, " live ticks/2") {
			t.Errorf("instance b: %q", l)
		}
		a := instance(st, "a")
		if a.Live || a.State != "lost" || len(a.Leading) != 0 || len(a.NotLeading) != 2 || a.NotLeading[0].LedBy != nil ||
			a.NotLeading[0].Epoch == nil || *a.NotLeading[0].Epoch != 5 {
			t.Errorf("instance a JSON: %+v", a)
		}
		if b := instance(st, "b"); !b.Live || b.State != "live" || len(b.Leading) != 1 || b.Leading[0].LedBy == nil || *b.Leading[0].LedBy != "b" {
			t.Errorf("instance b JSON: %+v", b)
		}
	})

	t.Run("TakenOver", func(t *testing.T) {
		// b takes ticks/0 over: it locks it and claims the checkpoint, and
		// lists it only at its next heartbeat. a's heartbeat still lists
		// it at epoch 5.
		k1, k2 := lockkey.Pair(catchup.LockKey("annals", "ticks", 0))
		if _, err := connB.Exec(t.Context(), "SELECT pg_advisory_lock($1::int4, $2::int4)", k1, k2); err != nil {
			t.Fatal(err)
		}
		sqlExec(t, db, `UPDATE annals.checkpoints SET epoch = 6, owner = 'b' WHERE subscriber_id = 'ticks' AND partition = 0`)
		out, st := agree(t)
		if l := tableLine(t, out, "ticks", "0"); !regexp.MustCompile(` 6 b \(lock held by backend [0-9]+\)$`).MatchString(l) {
			t.Errorf("ticks/0 taken over by b: %q", l)
		}
		if s := st.Subscribers[0]; s.Leader == nil || *s.Leader != "b" || s.LeaderEpoch == nil || *s.LeaderEpoch != 6 ||
			s.HeartbeatLeader == nil || *s.HeartbeatLeader != "a" {
			t.Errorf("ticks/0 JSON: %+v", s)
		}
		// b's heartbeat lists it: b leads it, and a does not.
		sqlExec(t, db, `UPDATE annals.instances SET last_heartbeat = now(),
			leads = '[{"subscriber": "ticks", "partition": 0, "epoch": 6}, {"subscriber": "ticks", "partition": 2, "epoch": 3}]' WHERE instance_id = 'b'`)
		out, st = agree(t)
		if l := tableLine(t, out, "ticks", "0"); !strings.HasSuffix(l, " 6 b") {
			t.Errorf("ticks/0 listed by b: %q", l)
		}
		if l := tableLine(t, out, "a", "vm", "1"); !strings.HasSuffix(l, " lost - (listed, not held: ticks/0, ticks/1)") {
			t.Errorf("instance a: %q", l)
		}
		if l := tableLine(t, out, "b", "vm", "2"); !strings.HasSuffix(l, " live ticks/0, ticks/2") {
			t.Errorf("instance b: %q", l)
		}
		if a := instance(st, "a"); len(a.NotLeading) == 0 || a.NotLeading[0].LedBy == nil || *a.NotLeading[0].LedBy != "b" {
			t.Errorf("instance a JSON: %+v", a)
		}
	})

	t.Run("Stopped", func(t *testing.T) {
		// SIGSTOP of c: its heartbeat ages, its session keeps the lock.
		sqlExec(t, db, `UPDATE annals.instances SET last_heartbeat = now() - interval '5 minutes' WHERE instance_id = 'c'`)
		out, st := agree(t)
		want := regexp.MustCompile(` c \(lock held by backend ` + strconv.Itoa(int(pidC)) + `, no live instance\)$`)
		if l := tableLine(t, out, "ticks", "3"); !want.MatchString(l) {
			t.Errorf("ticks/3: %q", l)
		}
		if s := st.Subscribers[3]; s.Leader == nil || *s.Leader != "c" || s.LeaderEpoch == nil || *s.LeaderEpoch != 4 ||
			s.HeartbeatLeader != nil || !s.LockHeld || s.LockPID == nil || *s.LockPID != int32(pidC) || !s.NoLiveInstance {
			t.Errorf("ticks/3 JSON: %+v", s)
		}
		if l := tableLine(t, out, "c", "vm", "3"); !strings.HasSuffix(l, " stale ticks/3") {
			t.Errorf("instance c: %q", l)
		}
		if c := instance(st, "c"); c.Live || c.State != "stale" || len(c.Leading) != 1 {
			t.Errorf("instance c JSON: %+v", c)
		}
	})
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// TestStatusWithAMalformedHeartbeat: an instance row whose leads is not an
// array (written by hand, or by a runner of another version) is no
// heartbeat leader of anything, and status, reading the heartbeat leaders
// as the console does (leadership.HeartbeatLeaderJoin), shows the
// partitions beside it as before.
func TestStatusWithAMalformedHeartbeat(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	sqlExec(t, db, `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner) VALUES ('ticks', 0, 0, 2, 'good')`)
	sqlExec(t, db, `INSERT INTO annals.instances (instance_id, host, pid, last_heartbeat, leads) VALUES
		('odd', 'vm', 1, now(), '{"subscriber": "ticks", "partition": 0, "epoch": 2}'),
		('scalar', 'vm', 2, now(), '7'),
		('good', 'vm', 3, now(), '[{"subscriber": "ticks", "partition": 0, "epoch": 2}]')`)
	conn, err := pgx.Connect(t.Context(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(t.Context()) })
	k1, k2 := lockkey.Pair(catchup.LockKey("annals", "ticks", 0))
	if _, err := conn.Exec(t.Context(), "SELECT pg_advisory_lock($1::int4, $2::int4)", k1, k2); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"text", "json"} {
		r := annals(t, db.URL, "status", "--output", format)
		if r.code != 0 || !regexp.MustCompile(`(?m)^ticks .* good\s*$|"leader": ?"good"`).MatchString(r.stdout) {
			t.Errorf("status --output %s: %+v, want ticks/0 led by good", format, r)
		}
	}
}
