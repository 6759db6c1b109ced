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
// reconnects with backoff (100 ms doubling to 5 s, jittered); subscriptions
// poll meanwhile, and on every (re)connect the Listener signals all of them so
// they re-read whatever was announced while nobody listened.
//
// # Per subscriber partition: the state machine
//
//	STANDBY   pg_try_advisory_lock(k1, k2), k = md5("schema:subscriber:partition"),
//	          on a dedicated connection.
//	            not acquired        -> wait LockRetryInterval (±50%), STANDBY
//	            acquired            -> CLAIM
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
//	any state, context ended: finish the batch in hand (bounded by ShutdownTimeout),
//	          flush, release the lock, return.
//
// Standing by costs one connection attempt per LockRetryInterval. A leader
// that crashes frees its lock when its session ends (the lock connection sets
// client_connection_check_interval and TCP keepalives so that this happens
// in about a second, not when a running query ends or hours later).
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
// its lock at its next read or commit and stands by), then polls the lock
// every 10 ms and takes it as soon as it is free, well before the standbys'
// next jittered attempt; if a standby wins anyway and claims, it fences again,
// until a bounded wait ends with ErrTakeOverTimeout. The caller then Drives
// the lease through a target position and Releases it; meanwhile every other
// instance stands by. Package projection's Rebuild is built on it.
//
// # Ephemeral subscriptions
//
// A subscription marked Ephemeral takes no lock and stores no checkpoint: it
// starts after a given position and keeps its cursor in memory (annals tail
// without --subscriber).
package catchup
