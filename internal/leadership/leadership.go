package leadership

// Facts are what is known of one subscriber partition at one moment.
type Facts struct {
	// Epoch is the checkpoint's fencing epoch.
	Epoch int64
	// Owner is the instance that claimed Epoch ("": none, as after an
	// operator's checkpoint set).
	Owner string
	// LockHeld reports whether a session holds the partition's advisory
	// lock, read live.
	LockHeld bool
	// HeartbeatLeader is the live instance whose heartbeat lists the
	// partition, preferring one at Epoch ("": none), and HeartbeatEpoch
	// the epoch it lists (nil: unknown).
	HeartbeatLeader string
	HeartbeatEpoch  *int64
}

// Leader returns who leads the partition by the rule of the package doc,
// and the epoch it leads at: "" and nil when nobody leads (the lock is
// free) or the session holding the lock is nothing that can be named.
func Leader(f Facts) (leader string, epoch *int64) {
	if !f.LockHeld {
		return "", nil
	}
	hb, owner := f.HeartbeatLeader, f.Owner
	switch {
	case hb != "" && (owner == "" || owner == hb || (f.HeartbeatEpoch != nil && *f.HeartbeatEpoch == f.Epoch)):
		if f.HeartbeatEpoch == nil {
			return hb, nil
		}
		e := *f.HeartbeatEpoch
		return hb, &e
	case owner != "":
		e := f.Epoch
		return owner, &e
	}
	return "", nil
}

// Unlisted reports a partition whose lock is held while no live instance's
// heartbeat lists it: whoever holds it is no live runner instance. Leader
// then names the checkpoint's owner, which may be a rebuild or a catch-up
// that leads without heartbeats, or a dead or frozen instance whose session
// (or a pooler's server session) was left holding the lock, which nobody
// processes; callers say so beside the leader rather than in its place.
func Unlisted(f Facts) bool { return f.LockHeld && f.HeartbeatLeader == "" }

// The states of an instance.
const (
	// Live: a fresh heartbeat, and it leads at least one of the partitions
	// it lists, or lists none.
	Live = "live"
	// Lost: a fresh heartbeat, but it leads none of the partitions it
	// lists: their locks are free or another instance leads them (killed a
	// moment ago, or its database session dropped).
	Lost = "lost"
	// Stale: its last heartbeat is older than the staleness threshold.
	Stale = "stale"
)

// State returns an instance's state from whether its heartbeat is fresh,
// how many partitions it lists, and how many of those it leads (by Leader:
// the partition's leader is the instance, or the partition has no
// checkpoint to say otherwise).
func State(fresh bool, listed, leading int) string {
	switch {
	case !fresh:
		return Stale
	case listed > 0 && leading == 0:
		return Lost
	}
	return Live
}
