// Package checkpoint stores how far each subscriber has processed the log:
// one row per (subscriber, partition) with the position of the last event
// handled, and a fencing epoch.
//
// # Fencing
//
// Every new leader of a subscriber partition calls Claim, which increments
// the row's epoch and returns it. Every later write says which epoch it
// belongs to (Commit: UPDATE … WHERE epoch = mine). Once another process has
// claimed the partition, the old leader's writes match no row and fail with
// ErrFenced: a process that has lost its leadership can never move the
// checkpoint, even if it has not noticed yet. Transactional projections run
// their read-model writes and the Commit in one transaction, so a fenced
// Commit rolls their writes back too. An operator's Set also bumps the epoch,
// so a running leader stops and re-reads instead of overwriting it.
//
// A leader learns of a fence when it next reads or writes. One waiting idle
// for new events would learn of it only at its next poll, so Set and Move
// announce the bump on FenceChannel (payload FencePayload), in the same
// statement, delivered when the caller's transaction commits; package
// catchup's Listener passes it to the partition's leader, which reads at
// once, finds the epoch changed and lets go. The announcement is a hint:
// the epoch stays the fence.
//
// Commit never moves a checkpoint backwards (greatest(old, new)).
//
// The epoch does not fence a leader off from itself. A commit whose answer
// was lost (the connection failed after COMMIT was sent) may still run on
// the server after the leader has read the checkpoint again and applied the
// same events once more on another connection: both transactions carry the
// leader's epoch. CommitFrom takes where the leader knows the checkpoint
// (from) and moves it only while it is not past that: the two transactions
// serialize on the row, and the later one fails with ErrMoved and rolls
// back. Package catchup's leases commit this way.
//
// # An operator's move
//
// Move (annals checkpoint set, the console's checkpoint set) moves an
// existing checkpoint anywhere between 0 and the head, bumping the epoch.
// Moving it back delivers the events after the new position again, so it
// also settles the partition's dead letters after that position as
// resolved, in the same statement (so in the caller's transaction): one
// that fails again is open again, and none is left open for a retry to
// deliver a second time. It reports how many it settled. Set is the plain
// write underneath: it moves or creates the row and touches nothing else.
//
// # Batched checkpoints
//
// Observers (side effects outside the database) are at-least-once anyway, so
// they need not write a checkpoint per event: a Batcher holds the position in
// memory and writes it every N events or T, and when told to Flush (before
// the runner waits idle and at shutdown). A crash replays at most the
// unflushed events.
package checkpoint
