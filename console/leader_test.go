package console_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/console"
	"github.com/annals-dev/annals/internal/lockkey"
)

// TestLeaderAfterKill: after kill -9 of a leader (its lock session ended,
// its heartbeat still fresh), the console names nobody leader of its
// partitions and shows the instance lost, on its pages, in /metrics and in
// the readiness JSON, as `annals status` does; after another instance takes
// a partition over (before its heartbeat lists it), that one leads it. The
// console read the leader from the heartbeats alone: the killed instance
// was leader, live, for the staleness threshold. A hung leader (heartbeat
// stale, lock held) leads, but is no live leader: readiness says so.
func TestLeaderAfterKill(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	// Two runner processes of "ticks": a leads 0 and 1, b leads 2; each
	// holds its locks on its own session.
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner) VALUES
			('ticks', 0, 0, 5, 'a'), ('ticks', 1, 0, 5, 'a'), ('ticks', 2, 0, 3, 'b');
		INSERT INTO annals.instances (instance_id, host, pid, last_heartbeat, leads) VALUES
			('a', 'vm', 1, now(), '[{"subscriber": "ticks", "partition": 0, "epoch": 5}, {"subscriber": "ticks", "partition": 1, "epoch": 5}]'),
			('b', 'vm', 2, now(), '[{"subscriber": "ticks", "partition": 2, "epoch": 3}]')`); err != nil {
		t.Fatal(err)
	}
	session := func(parts ...int) (*pgx.Conn, uint32) {
		t.Helper()
		conn, err := pgx.Connect(ctx, db.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(ctx) })
		for _, p := range parts {
			k1, k2 := lockkey.Pair(catchup.LockKey("annals", "ticks", p))
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", k1, k2); err != nil {
				t.Fatal(err)
			}
		}
		return conn, conn.PgConn().PID()
	}
	_, pidA := session(0, 1)
	connB, _ := session(2)

	c := consoleOn(t, db)
	ready := console.Readiness(db.Pool, &console.HealthConfig{Schema: db.Schema, Subscribers: map[string]int{"ticks": 3}})
	health := func() (int, map[int]console.PartitionHealth) {
		t.Helper()
		rec := httptest.NewRecorder()
		ready.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		var rep console.HealthReport
		if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		out := map[int]console.PartitionHealth{}
		for _, p := range rep.Partitions {
			out[p.Partition] = p
		}
		return rec.Code, out
	}
	row := c.row
	metric := func(series string) string {
		t.Helper()
		_, body := c.get("/metrics")
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, series+" ") {
				return strings.TrimPrefix(l, series+" ")
			}
		}
		t.Fatalf("/metrics lacks %s", series)
		return ""
	}

	// Before the kill: a leads 0 and 1, b leads 2.
	if r := row("/", "ticks", "0"); !strings.Contains(r, " running ") || !strings.Contains(r, " a 5 ") {
		t.Errorf("overview ticks/0 before the kill: %q", r)
	}
	if code, h := health(); code != 200 || h[0].Leader != "a" {
		t.Errorf("readiness before the kill: %d %+v", code, h)
	}

	// kill -9 of a: its session ends, its heartbeat stays fresh.
	var ok bool
	if err := db.Pool.QueryRow(ctx, "SELECT pg_terminate_backend($1::int, 10000)", pidA).Scan(&ok); err != nil || !ok {
		t.Fatalf("terminate a's session: %v %v", ok, err)
	}
	for _, page := range []string{"/", "/subscribers/ticks"} {
		for _, p := range []string{"0", "1"} {
			cells := []string{"ticks", p}
			if page != "/" {
				cells = cells[1:]
			}
			r := row(page, cells...)
			if !strings.Contains(r, "standing by") || !strings.Contains(r, "none (a's lock is free)") {
				t.Errorf("%s ticks/%s after a's kill: %q", page, p, r)
			}
		}
	}
	if r := row("/instances", "a", "vm", "1"); !strings.Contains(r, " lost ") || !strings.Contains(r, "(listed, not held: ticks/0 (epoch 5), ticks/1 (epoch 5))") {
		t.Errorf("/instances a after its kill: %q", r)
	}
	if r := row("/instances", "b", "vm", "2"); !strings.Contains(r, " live ticks/2 (epoch 3)") {
		t.Errorf("/instances b: %q", r)
	}
	if code, h := health(); code != 503 || h[0].Leader != "" || h[0].Problem != "no live leader" || h[2].Leader != "b" || !h[2].OK {
		t.Errorf("readiness after a's kill: %d %+v", code, h)
	}
	if v := metric(`annals_subscriber_led{partition="0",subscriber="ticks"}`); v != "0" {
		t.Errorf("annals_subscriber_led ticks/0 = %s, want 0", v)
	}
	if v := metric(`annals_instances{state="lost"}`); v != "1" {
		t.Errorf(`annals_instances{state="lost"} = %s, want 1`, v)
	}

	// b takes ticks/0 over: it locks it and claims the checkpoint, and
	// lists it only at its next heartbeat; a's heartbeat still lists it.
	k1, k2 := lockkey.Pair(catchup.LockKey("annals", "ticks", 0))
	if _, err := connB.Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", k1, k2); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "UPDATE annals.checkpoints SET epoch = 6, owner = 'b' WHERE subscriber_id = 'ticks' AND partition = 0"); err != nil {
		t.Fatal(err)
	}
	if r := row("/", "ticks", "0"); !strings.Contains(r, " running ") || !strings.Contains(r, " b 6 ") {
		t.Errorf("overview ticks/0 after b's takeover: %q", r)
	}
	if code, h := health(); code != 503 || h[0].Leader != "b" || !h[0].OK || h[1].Leader != "" {
		t.Errorf("readiness after b's takeover: %d %+v", code, h)
	}

	// b hangs (SIGSTOP): its heartbeat goes stale, its session keeps the
	// locks. It still leads, by the lock, but it is no live leader.
	if _, err := db.Pool.Exec(ctx, "UPDATE annals.instances SET last_heartbeat = now() - interval '1 hour' WHERE instance_id = 'b'"); err != nil {
		t.Fatal(err)
	}
	if r := row("/", "ticks", "2"); !strings.Contains(r, " leader stale ") || !strings.Contains(r, " b 3 ") {
		t.Errorf("overview ticks/2 with b hung: %q", r)
	}
	if r := row("/instances", "b", "vm", "2"); !strings.Contains(r, " stale ticks/2 (epoch 3)") {
		t.Errorf("/instances b hung: %q", r)
	}
	if code, h := health(); code != 503 || h[2].Leader != "b" || h[2].Problem != "no live leader: b holds the lock, but its heartbeat is stale" {
		t.Errorf("readiness with b hung: %d %+v", code, h)
	}
	if v := metric(`annals_subscriber_led{partition="2",subscriber="ticks"}`); v != "0" {
		t.Errorf("annals_subscriber_led ticks/2 with b hung = %s, want 0", v)
	}
}
