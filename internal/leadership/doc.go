// Package leadership decides, from facts read from the database, who leads
// a subscriber partition and what state a runner instance is in. It is the
// one place that rule lives: `annals status`, the operator console (its
// pages, metrics and health checks) and the projections command tree
// (projection/projectioncmd) all apply it, so that they never disagree
// about a leader.
//
// The partition's advisory lock, read live from pg_locks, has the last
// word, since a leader holds it for as long as it leads:
//
//   - lock free: nobody leads (a heartbeat may still list the partition:
//     its process was killed a moment ago);
//   - lock held: the live instance whose heartbeat lists the partition
//     leads, unless another instance has claimed the checkpoint since (a
//     leader claims it under the lock, and lists the partition only at its
//     next heartbeat): then the checkpoint's owner leads;
//   - lock held and no live instance lists it: the checkpoint's owner (a
//     hung process, a rebuild, a relay), or nobody that can be named (a
//     session that is no instance: the caller shows its backend pid).
//     Unlisted reports this case, which callers say beside the leader: the
//     owner may be an instance that is gone, whose session (or a pooler's
//     server session) was left holding the lock, and then nobody processes
//     the partition.
//
// An instance is live when its heartbeat is fresh and it leads at least one
// of the partitions it lists (or lists none), lost when its heartbeat is
// fresh but it leads none of them, stale when its heartbeat is old.
//
// Leader and State are pure. The facts they take are read alike by every
// caller through the two reads here: HeartbeatLeaderJoin (an SQL fragment
// the callers' templates include as {{.HeartbeatLeader "c" "$1"}}: the
// heartbeat leader of a checkpoint row) and LockStates (the partitions'
// advisory locks, live from pg_locks). The package imports no other annals
// package.
package leadership
