package console_test

import (
	"encoding/json"
	"fmt"
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

// TestNoLiveInstanceHoldsTheLock: a runner that took ticks/0's lock through
// a transaction-mode PgBouncer stopped (deregistered: no instance row) and
// left the lock on the pooler's server session. The console showed ticks/0
// "running", led by the dead runner, /readyz said it was healthy and
// annals_subscriber_led was 1, while nobody processed it. Now, as `annals
// status` says it (TestStatusSaysNoLiveInstanceHoldsTheLock), its state is
// "no live instance", its leader "gone-runner (lock held by backend PID, no
// live instance)" with a note naming the backend and the remedy, readiness
// says no live leader and led is 0. A partition a live instance lists, a
// rebuild's, and one a live instance has just taken before its heartbeat
// lists it stay running.
func TestNoLiveInstanceHoldsTheLock(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner) VALUES
			('ticks', 0, 0, 5, 'gone-runner'), ('ticks', 1, 0, 3, 'live'), ('ticks', 2, 0, 7, 'rebuild:ops'),
			('ticks', 3, 0, 2, 'live');
		INSERT INTO annals.instances (instance_id, host, pid, last_heartbeat, leads) VALUES
			('live', 'vm', 1, now(), '[{"subscriber": "ticks", "partition": 1, "epoch": 3}]')`); err != nil {
		t.Fatal(err)
	}
	// One session holds the four locks (what is left of the dead runner,
	// the live instance's, the rebuild's, and the live instance's newest,
	// claimed before its next heartbeat lists it).
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	for p := range 4 {
		k1, k2 := lockkey.Pair(catchup.LockKey("annals", "ticks", p))
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", k1, k2); err != nil {
			t.Fatal(err)
		}
	}
	pid := conn.PgConn().PID()

	c := consoleOn(t, db)
	leader := fmt.Sprintf(" gone-runner (lock held by backend %d, no live instance) 5 ", pid)
	for _, page := range []string{"/", "/subscribers/ticks"} {
		cells := []string{"ticks", "0"}
		if page != "/" {
			cells = cells[1:]
		}
		r := c.row(page, cells...)
		if !strings.Contains(r, " no live instance ") || strings.Contains(r, " running ") {
			t.Errorf("%s ticks/0: state not \"no live instance\": %q", page, r)
		}
		if !strings.Contains(r, leader) {
			t.Errorf("%s ticks/0: leader not %q: %q", page, leader, r)
		}
		for _, want := range []string{fmt.Sprintf("held by backend %d (last claimed by gone-runner)", pid),
			fmt.Sprintf("pg_terminate_backend(%d)", pid), "RECONNECT"} {
			if !strings.Contains(r, want) {
				t.Errorf("%s ticks/0: no %q: %q", page, want, r)
			}
		}
		for _, p := range []string{"1", "2", "3"} {
			r := c.row(page, append(cells[:len(cells)-1:len(cells)-1], p)...)
			if !strings.Contains(r, " running ") || strings.Contains(r, "no live instance") {
				t.Errorf("%s ticks/%s: %q", page, p, r)
			}
		}
	}

	ready := console.Readiness(db.Pool, &console.HealthConfig{Schema: db.Schema, Subscribers: map[string]int{"ticks": 4}})
	rec := httptest.NewRecorder()
	ready.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var rep console.HealthReport
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusServiceUnavailable || len(rep.Partitions) != 4 {
		t.Fatalf("readiness: %d %s", rec.Code, rec.Body)
	}
	want := fmt.Sprintf("no live leader: the lock is held by backend %d (last claimed by gone-runner), which no live instance lists", pid)
	if h := rep.Partitions[0]; h.OK || h.Problem != want || h.Leader != "gone-runner" {
		t.Errorf("readiness ticks/0: %+v; want problem %q", h, want)
	}
	for _, h := range rep.Partitions[1:] {
		if !h.OK {
			t.Errorf("readiness ticks/%d: %+v", h.Partition, h)
		}
	}

	_, body := c.get("/metrics")
	for p, want := range []string{"0", "1", "1", "1"} {
		series := fmt.Sprintf(`annals_subscriber_led{partition="%d",subscriber="ticks"} `, p)
		if !strings.Contains(body, series+want+"\n") {
			t.Errorf("/metrics: want %s%s", series, want)
		}
	}
}
