// Package catchup is the subscription engine: it elects one leader per
// subscriber partition across every process, catches the leader up from its
// checkpoint in batches, then follows the log live, woken by NOTIFY.
// Package projection builds the user-facing Runner on it; most users never
// import catchup directly.
//
// # Why a checkpoint is one number
//
// Positions (global_sequence) are commit order (see package eventstore):
// when a reader sees position N, every committed event below N is visible to
// it. So "everything after my checkpoint" is exactly
// WHERE global_sequence > checkpoint, with no gap detection, no timers and no
// xid horizon, and no unrelated long transaction can hold a subscriber back.
//
// # Per process
//
// One Listener holds a LISTEN connection on the schema's channel
// ("<schema>_events") and fans each notification out to every local
// subscription as a coalesced signal (a buffered channel of capacity one: a
// subscription that is busy finds one pending signal, however many arrived).
// A signal only means "the head may have moved"; it carries no data a
// subscription relies on. When the connection is lost, the Listener
// reconnects with backoff (100 ms doubling to 1 s, jittered); subscriptions
// poll meanwhile, and on every (re)connect the Listener signals all of them so
// they re-read whatever was announced while nobody listened.
//
// # Per subscriber partition: the state machine
//
//	STANDBY   registered with the engine's standby poller (below), which tries
//	          pg_try_advisory_lock(k1, k2), k = md5("schema:subscriber:partition"),
//	          for every waiting partition at once, on one standby session
//	            not acquired        -> next poll: LockRetryInterval (20 ms ±25%),
//	                                   or at once when a release is announced
//	            acquired            -> that session is now the partition's lock
//	                                   connection -> CLAIM
//	            session unusable    -> wait RetryBackoff (doubling, jittered), STANDBY
//	CLAIM     checkpoint row: epoch = epoch + 1, owner = this instance;
//	          cursor = its position -> READ
//	READ      next batch after the cursor (see below), with the checkpoint's epoch,
//	          its stop reason and the partition's dead-letter counts
//	            epoch changed       -> RELEASE, STANDBY (an operator set the checkpoint)
//	            released entries    -> REDELIVER
//	            stopped             -> IDLE (nothing is processed until an operator acts)
//	            events or skippable -> PROCESS
//	            nothing new         -> IDLE
//	PROCESS   the processor handles the batch; cursor = how far it got
//	            ok                  -> READ
//	            handler error       -> the processor retries it by its policy, then
//	                                   dead-letters it (package projection);
//	                                   other errors: wait RetryBackoff, READ
//	            fenced / lock lost  -> RELEASE, STANDBY
//	REDELIVER the processor re-delivers dead letters an operator released, in
//	          position order                 -> READ
//	IDLE      write a buffered checkpoint if due; wait for a signal, PollInterval,
//	          or lock loss
//	            signal or timeout   -> READ
//	            lock lost           -> RELEASE, STANDBY
//	RELEASE   unlock and announce it on "<schema>_locks" (one statement), close
//	          the lock's connection; after a loss or fencing wait RetryBackoff,
//	          then STANDBY
//	any state, context ended: finish the batch in hand (bounded by ShutdownTimeout),
//	          flush, RELEASE, return.
//
// # Standing by and taking over
//
// Takeover time is the time from a leader's end to a standby's claim. The
// server's part is under a millisecond: PostgreSQL frees a dead session's
// advisory locks as the backend exits, and the lock connection sets
// client_connection_check_interval and TCP keepalives so that the backend
// notices a dead client in about a second even in the middle of a query, and
// a vanished host within seconds, not when the query ends or hours later.
// The rest is how soon a standby asks, and that is the engine's design:
//
//   - One standby session per engine (per process, as a Runner has one
//     engine), not one per partition. Every partition the engine does not
//     lead registers with the standby poller and waits. The poller holds one
//     advisorylock.Standby and, every LockRetryInterval (default 20 ms, ±25%
//     so that processes drift apart), runs one statement that tries the
//     locks of all waiting partitions (pg_try_advisory_lock over unnest). A
//     lock it wins is taken on the standby session itself, which becomes
//     that partition's lock connection: the takeover path opens no
//     connection. The poller then opens a new standby session if partitions
//     still wait, and closes it when none does; a process that leads
//     everything it runs holds none. If one poll wins several locks (a
//     leader of several partitions died), the first keeps the session and
//     the others are given back at once and taken, in parallel, each on a
//     new connection of its own (a lead needs its own connection), racing
//     other standbys fairly; the next poll tries them too.
//   - A graceful release is announced: Release unlocks and sends the key
//     with pg_notify on "<schema>_locks" in one statement, and standby
//     sessions LISTEN on that channel, so a graceful handover (shutdown,
//     fencing) is taken over at once, not at the next poll. Leaders never
//     notify in the append path (a notifying commit is serialized).
//   - A crash announces nothing: the next poll finds the lock free. The kill
//     lands anywhere in the 15–25 ms cycle, so the wait is about 10 ms on
//     average (the residual of a uniform 15–25 ms renewal) and at most 25
//     ms, plus the poll's and the claim's round trips.
//   - Fencing is unchanged: after the lock, CLAIM bumps the epoch on the
//     lock's connection, a processor commits only on that connection with
//     UPDATE … WHERE epoch = mine, and a lost lock (the watcher sees the
//     session end) or a changed epoch ends the leadership. The standby
//     session is set up like any lock connection (check interval,
//     keepalives, user timeout), since it may become one.
//
// Costs: per standby process one idle connection and one round trip per 20
// ms (about 50 tiny statements a second, each a lock-table probe per
// waiting partition), against one connection attempt (a backend start) per
// partition per 2 s before. See docs/benchmarks.md for the takeover figures
// and for append throughput with and without polling standbys.
//
// Alternatives considered. (1) Each standby partition waiting in the lock
// queue (pg_advisory_lock) is granted the lock in under a millisecond, but
// needs a blocked connection per partition per standby process: too many
// connections for a process standing by for hundreds of partitions. (2) A
// wake-up: each leader holds an "instance liveness" lock as well, and a
// standby blocks one extra connection in pg_advisory_lock on it; granted the
// moment the leader's session ends, it tries the partition locks at once.
// It reacts in about a millisecond, but one blocked connection waits for
// one leader: with partitions led by several instances a standby needs a
// connection per leader instance (or falls back to polling for the rest),
// the liveness lock must follow every lead's connection (a lead holds its
// own session, so the liveness lock does not die with a single lead's
// session), and a leader that lost only one partition's session wakes
// nobody. Polling at 20 ms meets the target (median ≤ 50 ms, max ≤ 250 ms)
// with one connection and no coupling between leaders and standbys, and the
// graceful case, the common one, is announced. (3) LISTEN alone covers only
// graceful releases.
//
// TakeOver (rebuilds) must win against standbys that poll every 20 ms and
// are woken by the release notice, so it does not poll: it fences the leader
// and waits in the lock's queue (advisorylock.Acquire). PostgreSQL grants a
// released lock to the queued session, and pg_try_advisory_lock fails while
// a session queues, so no standby can snatch it.
//
// The listener subscription is made, and LISTEN is confirmed active (or a
// poll interval has passed), before the first read, so an event committed
// while the leader catches up is either in a read or announced afterwards.
//
// # Reading a batch
//
// One statement returns up to BatchSize matching events after the cursor and
// the head (max global_sequence) from the same snapshot. Event-type globs and
// the partition (annals.stream_partition(stream_id, n)) are applied in SQL.
// If fewer than BatchSize events match, every event up to the head has been
// considered, so the batch covers ("Through") the head and the checkpoint may
// move past events that did not match; otherwise it covers through the last
// event returned. A subscriber that matches nothing still advances.
//
// # Reading ahead
//
// While a full batch is processed (on the lock's connection), the next one
// is read (on the pool), so that a long catch-up overlaps the read of batch
// N+1 with handling and committing batch N. The read-ahead is made only when
// nothing about the partition is pending (no unresolved or released dead
// letters, no stop reason), and it is used only if batch N succeeded
// completely (the processor returned its Through and no error) and the
// processor did not call Lease.Changed (it wrote a dead letter or stopped the
// partition, which changes what the next read reports). Otherwise it is
// discarded and the batch read again. The read-ahead is always waited for
// before the loop goes on; it never moves a checkpoint.
//
// # Processing and fencing
//
// A Processor handles each batch and reports how far it got. Transactional
// projections run the batch and the checkpoint update in one transaction on
// the lock's own connection: if the lock's session dies, the transaction dies
// with it. The checkpoint update is also fenced by the epoch the leader
// claimed (UPDATE … WHERE epoch = mine), so a process that lost leadership —
// or whose checkpoint an operator reset — cannot move it; it fails with
// checkpoint.ErrFenced and the engine returns to standby, re-claiming (and
// re-reading from the stored checkpoint) if it gets the lock again.
// Lease.CommitTx and Lease.CommitConn send the fenced update and COMMIT in
// one round trip: the update (CommitFenced) fails when fenced instead of
// changing no row, so the pipelined COMMIT is skipped and nothing commits.
//
// A failed batch is retried after RetryBackoff from the position the
// processor reports: for projections, the events before the failing one are
// committed first, so the failing event is retried alone and its batch-mates
// are applied exactly once; the engine never moves past a failing event.
//
// # Partitions
//
// A subscriber split into N partitions is N independent subscriptions, each
// with its own lock, checkpoint and cursor, reading only the streams whose
// stream_partition is its number. Each stream lives in one partition, so
// per-stream order holds, and N instances can share the work.
//
// # Taking over (rebuilds)
//
// TakeOver makes an engine the leader of a partition at once, whoever leads
// it: it bumps the checkpoint's epoch (fencing the leader, which releases
// its lock at its next read or commit and stands by), then waits for the
// lock in PostgreSQL's lock queue, where it gets it the moment the leader
// lets go, ahead of every standby; if a standby took the lock and claimed
// before TakeOver queued, it fences again (it checks every 10 ms), until a
// bounded wait ends with ErrTakeOverTimeout. The caller then Drives
// the lease through a target position and Releases it; meanwhile every other
// instance stands by. Package projection's Rebuild is built on it.
//
// # Ephemeral subscriptions
//
// A subscription marked Ephemeral takes no lock and stores no checkpoint: it
// starts after a given position and keeps its cursor in memory (annals tail
// without --subscriber).
package catchup
