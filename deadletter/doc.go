// Package deadletter lets an operator inspect and act on dead letters: the
// events a subscriber could not process, kept in the dead_letters table
// with the error, its stack and the attempt count. The command line's
// `annals dlq` is built on it.
//
// The package works on the database alone (a *pgxpool.Pool); it needs no
// running subscriber and imports nothing of the runner. The runner (package
// projection) writes dead letters and re-delivers the released ones; this
// package only moves them between statuses, and both meet in the table.
//
// # How events get here
//
// When a handler fails and its retry policy is spent (or the error is
// marked annals.Permanent), the runner records the event with reason
// "failed" and status open. Under the ParkStream policy the event's stream
// is then parked for that subscriber partition: every later event of the
// same stream is recorded too, untried, with reason "parked", so that the
// stream's order is never broken while other streams flow on. Under the
// Stop policy the runner also halts the subscriber partition
// (checkpoints.stopped_reason is set) until an operator acts.
//
// Under ParkStream (the default for projections), a stream is parked for a
// subscriber partition while it has dead letters with status open or retry;
// under SkipEvent (the default for observers) nothing is parked.
//
// # Statuses
//
//	open      waits for an operator (under ParkStream its stream is parked).
//	retry     released by an operator: the live runner re-delivers it, in
//	          position order with the rest of its stream.
//	resolved  re-delivered successfully. The stream flows again once none
//	          of its dead letters is open or retry.
//	skipped   an operator gave up on the event: resolved without delivery.
//	          Also where a dead letter ends whose event no longer exists in
//	          the log (see "Events removed from the log").
//
// # Lifecycle
//
//	        runner: failed, or parked behind a failure
//	                        │
//	                        ▼
//	   ┌─────────────────► open ───────────── Skip ──────────┐
//	   │                    │                                 ▼
//	   │ re-delivery        │ Retry, RetryAll, or Skip     skipped
//	   │ fails (runner)     │ of another entry of the         ▲
//	   │                    ▼ stream                          │
//	   └───────────────── retry ───────────── Skip ──────────┘
//	                        │
//	                        │ re-delivered (runner)
//	                        ▼
//	                    resolved
//
//	An entry whose event is no longer in the log goes to skipped instead of
//	retry (Retry, RetryAll, Skip of another entry of its stream), or from
//	retry to skipped (runner): see "Events removed from the log".
//
//	Purge deletes resolved and skipped dead letters last updated at or
//	before a cutoff (and open and retry ones too, if asked).
//
// Retry(id) releases a whole parked stream: every open dead letter of the
// same subscriber, partition and stream becomes retry, so that the runner
// re-delivers the failed event and the events parked behind it in order; it
// also clears the partition's Stop. Releasing only the failed event would
// let the runner re-deliver it and then leave the stream parked behind
// events nobody released. RetryAll does the same for every open dead letter
// of a subscriber and resumes all its halted partitions. Skip marks one
// dead letter skipped and releases the rest of its stream the same way.
//
// If a re-delivery fails, the runner puts the dead letter, and the released
// ones behind it in its stream, back to open (with the new error). The
// runner re-delivers an entry in a transaction that holds its row lock from
// before the handler runs until the entry is resolved (for an observer, a
// transaction bounded by the handler timeout and a few seconds), so an
// operation on it meanwhile waits: a Skip then finds it resolved if the
// handler succeeded, and skipped always means "never delivered".
//
// # Events removed from the log
//
// A dead letter keeps its event's position, not the event: a hard delete
// followed by a scavenge, a truncation or a retention policy (package
// scavenge) may remove the event from the log while its dead letter is
// open or released. Such an entry can never be delivered, and it must not
// hold its stream or its partition, so it is skipped once it is acted on
// or released, with "not delivered: the event no longer exists in the log"
// in front of its error (the last error follows on the next line). An
// open entry is not looked at by itself: until an operator retries or
// skips it, it parks its stream as any open
// entry does, and annals dlq list shows it:
//
//   - Retry, RetryAll and Skip mark it skipped instead of releasing it and
//     list it in Change.Gone (and in Change.Skipped); annals dlq retry
//     prints it ("gone" with --output json). The rest of its stream is
//     released and flows on without it.
//   - The runner, finding a released entry whose event went after the
//     release, marks it skipped the same way, logs one warning for all it
//     found, and re-delivers the rest.
//
// # Guarantees of the operations
//
// Each operation runs in one transaction (the ...Tx variants run in the
// caller's), locks the dead letter it names first so that concurrent
// operators take turns, and reports exactly what it changed in a Change.
// Each is idempotent: Retry of a dead letter that is no longer open, Skip of
// one already resolved or skipped, a second RetryAll or Purge change nothing
// and say so. An unknown ID fails with ErrNotFound and changes nothing; a
// bad argument fails with ErrInvalid.
//
// List pages newest first, by ID, with a cursor: Filter.Before set to the
// last ID of a page gives the next one, which repeats no dead letter and
// passes over none, however many are added or purged between the two
// (Filter.Offset, kept for compatibility, does both). A page is one index
// range scan from the cursor: the primary key's, or with a subscriber or
// status filter that of (subscriber_id, id) or (status, id) (migration
// 0028); a stream or type filter passes over the rows it does not match.
package deadletter
