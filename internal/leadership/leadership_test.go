package leadership

import "testing"

func TestLeader(t *testing.T) {
	t.Parallel()
	e := func(n int64) *int64 { return &n }
	cases := []struct {
		name   string
		f      Facts
		leader string
		epoch  *int64
		// unlisted: held, and no live instance lists it (Unlisted)
		unlisted bool
	}{
		{"lock free, heartbeat lists it (killed a moment ago)", Facts{Epoch: 5, Owner: "a", HeartbeatLeader: "a", HeartbeatEpoch: e(5)}, "", nil, false},
		{"lock free, nothing lists it", Facts{Epoch: 5, Owner: "a"}, "", nil, false},
		{"held by the heartbeat leader", Facts{Epoch: 5, Owner: "a", LockHeld: true, HeartbeatLeader: "a", HeartbeatEpoch: e(5)}, "a", e(5), false},
		{"held, claimed since by another (taken over)", Facts{Epoch: 6, Owner: "b", LockHeld: true, HeartbeatLeader: "a", HeartbeatEpoch: e(5)}, "b", e(6), false},
		{"held, heartbeat leader at the checkpoint's epoch", Facts{Epoch: 5, Owner: "b", LockHeld: true, HeartbeatLeader: "a", HeartbeatEpoch: e(5)}, "a", e(5), false},
		{"held, no owner (after a checkpoint set)", Facts{Epoch: 7, LockHeld: true, HeartbeatLeader: "a", HeartbeatEpoch: e(5)}, "a", e(5), false},
		{"held, nobody lists it (hung, rebuild)", Facts{Epoch: 5, Owner: "rebuild:x", LockHeld: true}, "rebuild:x", e(5), true},
		{"held by a session nothing names", Facts{Epoch: 5, LockHeld: true}, "", nil, true},
		{"held, heartbeat epoch unknown", Facts{Epoch: 5, LockHeld: true, HeartbeatLeader: "a"}, "a", nil, false},
	}
	for _, c := range cases {
		l, ep := Leader(c.f)
		if l != c.leader || (ep == nil) != (c.epoch == nil) || (ep != nil && *ep != *c.epoch) {
			t.Errorf("%s: Leader = %q, %v; want %q, %v", c.name, l, ep, c.leader, c.epoch)
		}
		if got := Unlisted(c.f); got != c.unlisted {
			t.Errorf("%s: Unlisted = %v; want %v", c.name, got, c.unlisted)
		}
	}
}

func TestState(t *testing.T) {
	t.Parallel()
	cases := []struct {
		fresh           bool
		listed, leading int
		want            string
	}{
		{true, 0, 0, Live},
		{true, 2, 1, Live},
		{true, 2, 0, Lost},
		{false, 1, 1, Stale},
		{false, 0, 0, Stale},
	}
	for _, c := range cases {
		if got := State(c.fresh, c.listed, c.leading); got != c.want {
			t.Errorf("State(%v, %d, %d) = %q; want %q", c.fresh, c.listed, c.leading, got, c.want)
		}
	}
}
