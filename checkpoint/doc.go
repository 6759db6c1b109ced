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
// Commit never moves a checkpoint backwards (greatest(old, new)).
//
// # Batched checkpoints
//
// Observers (side effects outside the database) are at-least-once anyway, so
// they need not write a checkpoint per event: a Batcher holds the position in
// memory and writes it every N events or T, and when told to Flush (before
// the runner waits idle and at shutdown). A crash replays at most the
// unflushed events.
package checkpoint
