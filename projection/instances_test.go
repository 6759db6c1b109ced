package projection_test

import (
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
)

// TestInstanceExpiry: a live runner deletes the registry rows of instances
// whose last heartbeat is older than Config.InstanceExpiry (a process that
// died without deregistering), keeps younger ones and its own, and expires
// nobody when InstanceExpiry is negative.
func TestInstanceExpiry(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T) *liveHarness {
		h := newLiveHarness(t)
		h.query(`WITH i AS (INSERT INTO annals.instances (instance_id, host, pid, last_heartbeat, leads) VALUES
			('dead',  'host-a', 1, now() - interval '1 hour',   '[]'),
			('young', 'host-b', 2, now() - interval '1 minute', '[]') RETURNING 1) SELECT count(*) FROM i`)
		return h
	}
	has := func(h *liveHarness, id string) bool {
		return h.query(`SELECT count(*) FROM annals.instances WHERE instance_id = $1`, id) == 1
	}

	t.Run("Expired", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		cfg := testConfig(time.Second)
		cfg.HeartbeatInterval = 50 * time.Millisecond
		cfg.InstanceExpiry = 10 * time.Minute
		r := h.newRunner(cfg, nil, &seenProjection{name: "seen"})
		h.run(r)
		annalstest.WaitFor(t, 10*time.Second, func() bool { return !has(h, "dead") })
		if !has(h, "young") || !has(h, r.InstanceID()) {
			t.Fatalf("young %v, own row %v: want both kept", has(h, "young"), has(h, r.InstanceID()))
		}
	})

	t.Run("DefaultIsTenHeartbeats", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		cfg := testConfig(time.Second)
		cfg.HeartbeatInterval = 5 * time.Second // expiry 50 s: "young" (1 minute) goes too
		// "recent" beat 30 s ago: still under 50 s when the check below
		// runs (at most 15 s later), so a shorter default expires it.
		h.query(`WITH i AS (INSERT INTO annals.instances (instance_id, host, pid, last_heartbeat, leads) VALUES
			('recent', 'host-c', 3, now() - interval '30 seconds', '[]') RETURNING 1) SELECT count(*) FROM i`)
		r := h.newRunner(cfg, nil, &seenProjection{name: "seen"})
		h.run(r)
		// Taking the lead beats at once; the first tick comes 5 s later.
		annalstest.WaitFor(t, 15*time.Second, func() bool { return !has(h, "dead") && !has(h, "young") })
		if !has(h, "recent") {
			t.Fatal("an instance that beat 30 s ago expired: the default expiry is under 10 heartbeats (50 s)")
		}
	})

	t.Run("Disabled", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		cfg := testConfig(time.Second)
		cfg.HeartbeatInterval = 50 * time.Millisecond
		cfg.InstanceExpiry = -1
		r := h.newRunner(cfg, nil, &seenProjection{name: "seen"})
		h.run(r)
		annalstest.WaitFor(t, 10*time.Second, func() bool { return has(h, r.InstanceID()) })
		beat := func() int64 {
			return h.query(`SELECT (extract(epoch FROM last_heartbeat) * 1e6)::bigint FROM annals.instances WHERE instance_id = $1`, r.InstanceID())
		}
		first := beat()
		annalstest.WaitFor(t, 10*time.Second, func() bool { return beat() > first }) // a heartbeat ran
		if !has(h, "dead") || !has(h, "young") {
			t.Fatal("an instance expired with InstanceExpiry < 0")
		}
	})
}
