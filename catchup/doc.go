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
// they re-read whatever was announced while nobody listened. The same
// connection listens to the schema's fence channel and passes each fence
// announcement to the fenced partition's leader alone (see Announcing a
// fence).
//
// # Per subscriber partition: the state machine
//
//	STANDBY   registered with the engine's lock session (below), which looks
//	          at pg_locks and tries pg_try_advisory_lock(k1, k2),
//	          k = md5("schema:subscriber:partition"), for the waiting
//	          partitions it wants, all in one poll on one session
//	            not taken           -> next poll: LockRetryInterval (20 ms ±25%),
//	                                   or at once when a release is announced
//	            taken               -> the lock stays on the lock session; in the
//	                                   same poll, on that session, CLAIM
//	            held by this engine -> not tried (another Run or a CatchUp of it
//	                                   on this engine leads): wait for the
//	                                   release, as another process would
//	            session unusable    -> wait RetryBackoff (doubling, jittered), STANDBY
//	CLAIM     checkpoint row: epoch = epoch + 1, owner = this instance;
//	          cursor = its position -> READ
//	            row held elsewhere  -> after 200 ms (the claim's lock_timeout) give
//	                                   the lock back, STANDBY (the partition is
//	                                   not tried again for 200 ms)
//	READ      next batch after the cursor (see below), with the checkpoint's epoch,
//	          its stop reason and the partition's dead-letter counts
//	            epoch changed       -> RELEASE, STANDBY (an operator set the checkpoint)
//	            released entries    -> REDELIVER
//	            stopped             -> IDLE (nothing is processed until an operator acts)
//	            events or skippable -> PROCESS
//	            nothing new         -> IDLE
//	PROCESS   the processor handles the batch on a pool connection (Lease.Do);
//	          cursor = how far it got
//	            ok, batch not full  -> IDLE (it reached the head of its read: what
//	                                   came since is announced by a signal, so an
//	                                   immediate second read would find nothing)
//	            ok                  -> READ
//	            handler error       -> the processor retries it by its policy, then
//	                                   dead-letters it (package projection);
//	                                   other errors: wait RetryBackoff, READ
//	            fenced / lock lost  -> RELEASE, STANDBY
//	REDELIVER the processor re-delivers dead letters an operator released, in
//	          position order (an entry whose event was scavenged is marked
//	          skipped instead); batches read ahead are dropped -> READ
//	            a nil re-delivery and the next read counts no fewer released
//	            entries: wait RetryBackoff (and warn once), READ
//	IDLE      write a buffered checkpoint if due; wait for a signal, PollInterval
//	          (or, sooner, the processor's next deadline: IdleDeadliner, an
//	          observer's CheckpointInterval; a deadline that Idle did not
//	          move past: RetryBackoff), an announced fence of the
//	          partition, lock loss or a handover request
//	            signal, fence or timeout -> READ (a fence: the read finds the
//	                                   epoch changed)
//	            lock lost           -> RELEASE, STANDBY
//	            handover requested  -> HANDOVER
//	HANDOVER  (balanced subscribers) as at shutdown: finish the batch in hand,
//	          flush, RELEASE, then STANDBY at once (no backoff)
//	RELEASE   the lock session unlocks and announces it on "<schema>_locks"
//	          (one statement); after a loss or fencing wait RetryBackoff,
//	          then STANDBY
//	any state, context ended: finish the batch in hand (bounded by ShutdownTimeout),
//	          flush, RELEASE, return.
//
// # The lock session
//
// Each engine (a Runner has one) holds every lock it holds for Run and
// CatchUp on one connection, its lock session (an advisorylock.Standby
// kept, not spent): the locks of the partitions it leads, and one member
// slot per balanced subscriber it runs (below). One goroutine owns the
// session and polls on it every LockRetryInterval (15–25 ms) or at once
// when something changes: a local lead ends (it gives the lock back,
// announced), a partition starts waiting, or a release is announced on
// "<schema>_locks", which the session LISTENs to. A poll is one statement
// while nothing is to be taken (a look at pg_locks for the member slots and
// the wanted partitions), two or three when something is (pg_try_advisory_lock
// over unnest, then the claims, on the same session). The session is set up
// like any lock connection (client_connection_check_interval, keepalives,
// user timeout, idle_session_timeout), so that the server frees its locks
// within about a second of the process's end even mid-query, at once when
// the process dies and the kernel closes its socket, and after the lock's
// FreezeTimeout when the process is frozen with its connections up (the
// poller's Wait pings the session when it has run no statement for a
// third of it). It is opened as the engine's pool opens
// its connections: the pool's BeforeConnect runs on a copy of its
// ConnConfig at every dial (rotating credentials), then its AfterConnect
// (Config.Lock.Connect, unless the caller sets its own).
//
// A claim waits for the checkpoint row at most 200 ms: the one poller
// serves every partition of the process, so a row held elsewhere (an open
// transaction of an operator's) must not hold up the others' takeovers and
// releases; the claim gives the lock back and the partition stands by
// again. A partition's Run or CatchUp whose context ends returns at once,
// also while the poller claims for it: the poller gives back what it took.
//
// Advisory locks are re-entrant on a session, so the poll never tries a
// key the session already holds: a second Run of a partition on the same
// engine, or a CatchUp of it while a Run leads, stands by until the lock is
// given back, as in another process.
//
// Batches do not run on the lock session: a processor's statements go
// through Lease.Do to a connection of the engine's pool, held for the
// batch. So the batch's session is not the lock's, and what protects the
// read model and the checkpoint is the fence:
//
//   - CLAIM bumps the checkpoint's epoch, and a batch commits with
//     CommitFencedHeld in the transaction's COMMIT round trip: the
//     checkpoint moves only WHERE epoch = mine AND some session holds the
//     partition's lock (a shared try-lock from the batch's transaction
//     fails), and otherwise the statement fails and nothing commits
//     (checkpoint.ErrFenced ends the leadership). A new leader claims only
//     after it holds the lock; the old leader's UPDATE and the claim's
//     UPDATE serialize on the checkpoint row, so either the old commit comes
//     first and the claim reads its position, or the claim comes first and
//     the old commit fails. No event is applied twice, and none is skipped.
//     The epoch alone gives that; the lock test adds that a leader whose
//     lock session has ended commits nothing even while nobody has taken
//     the lock yet. (It used to read pg_locks for the lock session's own
//     pid: the same guarantee where it matters, since a lock held by
//     another session means a new leader, whose claim the epoch catches,
//     at about 0.1 ms more server CPU per batch; measured, that was 5–8% of
//     a no-op projection's catch-up.)
//   - When the lock session ends (the engine sees its socket fail), every
//     lease it held is marked lost, and the pool connection of a batch in
//     flight is closed under it: its transaction rolls back at once and its
//     row locks do not hold up the next leader.
//
// Costs: per process one connection and one poll per LockRetryInterval
// (about 50 a second), whatever the number of partitions. A poll of an
// engine with balanced subscribers reads pg_locks once (the whole lock
// table, joined with the member slots and partitions it probes); measured
// on the shared 2-core machine (load 16), 3 runners each running 4
// subscribers of 16 partitions: each lock session's backend used 1.9% of a
// core (about 0.4 ms per poll), against 0.45% for the single-statement
// try-lock poll of a standby before balancing. LockRetryInterval trades
// this linearly against takeover time.
//
// Connections of one process: 1 lock session + 1 listener + the pool's
// MaxConns (the pool serves the batches in flight, the reads and the
// read-ahead; a process leading P partitions of S subscribers processes at
// most MaxConns batches at once, whatever P and S). A process that stands
// by for everything holds only the lock session and the listener beside an
// idle pool. Before, each led partition held a connection of its own.
//
// # Balanced leadership
//
// A subscription with Balance (the Runner sets it) shares its partitions
// with the other instances running the same subscriber. Membership is a
// lock too: an instance running the subscriber holds one of MaxMembers
// member slots, the lock "schema:subscriber:member/i", on its lock session,
// taking the lowest free one. The live members are the slots some session
// holds, which every poll reads from pg_locks in the same statement as the
// state of the wanted partitions. A member's slot and its partitions are on
// the same session, so they end together: a dead instance leaves the
// membership in the same instant its partitions become free, and no
// heartbeat expiry is involved (the instances table and its heartbeats
// remain what status shows; they are not on the takeover path).
//
// Each poll, for each balanced subscriber with P partitions, a member
// computes N (live slots) and its position: its slot's rank among the live
// slots, rotated by a hash of the subscriber's name (so that with several
// subscribers the members that lead one more are not always the same). Its
// target is ⌊P/N⌋, plus one if its position is below P mod N: the targets
// of the N members add up to P. Then:
//
//	led > target at two polls in a row -> ask the excess leads (random) to
//	                                      HANDOVER (finish the batch, flush,
//	                                      release, announced)
//	led < target                       -> try target − led of the free
//	                                      partitions (free in this poll's
//	                                      pg_locks), starting at an offset that
//	                                      depends on its position, so that
//	                                      members taking at once take different
//	                                      ones
//	no slot yet                        -> take the lowest free slot; take no
//	                                      partition until the next poll
//	every slot taken                   -> take any free partition (as
//	                                      unbalanced)
//
// At shutdown the slot is given back first (announced), then the
// partitions: the other members' targets grow before the partitions are
// free, so they take them at the release notices, without waiting for a
// poll.
//
// Why no partition is led by two instances at once: leading means holding
// the partition's advisory lock and the checkpoint's current epoch.
// PostgreSQL grants the lock to one session at a time; the balancer only
// decides who tries, and a handover gives the lock back only after the
// leader has finished its batch and flushed. A leader that lost its lock
// without knowing (its lock session ended) cannot commit: the commit checks
// that the lock is held (by a session that, if not its own, has claimed or
// will claim after this commit) and that the epoch is its own, and
// a batch in flight has its connection closed when the loss is seen. So at
// any moment at most one instance can commit for a partition.
//
// Why none is left unled longer than the bound: a partition is free only
// when its leader gave it back (shutdown, handover, fencing: announced on
// "<schema>_locks", and every lock session wakes at once) or its lock
// session ended (a crash: the slot ends with it). In the second case, at
// the next poll of each survivor (at most 25 ms later) N has dropped, the
// targets add up to P again, and the sum of the deficits equals the number
// of free partitions; each survivor tries its deficit in that poll. Two
// survivors may try the same partition (each one's view is its own poll's);
// the loser still has a deficit and takes another at its next poll, and
// as the deficits add up to the free partitions, all are taken within a
// poll or two: about 10 ms on average and at most about 50 ms plus round
// trips at the defaults (see docs/benchmarks.md). If views differ (a member
// joined between two members' polls), a member may find itself over its
// target for one poll; the two-polls rule keeps that from causing a
// handover, and an under-target member only takes free partitions, so no
// partition is taken away from a live leader except by its own handover.
//
// When only the lock session ends and its process lives (the session was
// terminated, the connection cut), that member's poller opens a new
// session and takes a member slot again at once, so N does not drop and
// the member is owed what it held: its partitions stand by again at once
// (not after RetryBackoff), and it takes them back within a poll of its
// new session (18 ms in the projection package's three-member test,
// against ~265 ms when they waited out RetryBackoff and the orphan rule
// below handed them elsewhere). Sessions that keep ending soon after they
// opened (the second in a row within 10 s, say a proxy that cuts them)
// are replaced after RetryBackoff instead, doubled per end up to a second
// (or RetryBackoff), so that the member's partitions are not claimed again
// at reconnect speed; meanwhile the orphan rule hands them to the others.
//
// The deficit argument assumes every live member takes what it is owed. A
// member can hold its slot and yet not stand by for a partition it is owed:
// its goroutine for it is still inside a batch of a leadership it lost (the
// handler has not returned), so only its slot is live. The orphan rule
// covers that: a partition a member stands by for that has been free
// (nobody holding or queued for its lock) at every poll for orphanGrace
// (250 ms) is taken by that member whatever its target. A normal handover
// is over within a poll or two, far inside the grace, so the rule does not
// fire while membership settles; a partition taken over the target is
// handed back by the two-polls rule once its owed member stands by again
// (TestOrphanedPartitionIsTaken: ten live slots that take nothing; the one
// real member leads the partition ~0.3 s after it became free).
//
// Sticky: while membership is stable every member has exactly its target,
// nobody is over (no handover) and nobody is under (no take), so nothing
// moves. A new member makes the others' targets shrink: they hand over
// their excess (announced), and the new member takes it at the notices, in
// a few polls (tens of milliseconds) after it took its slot.
//
// A lock no live instance holds. The rules above assume that every
// session holding a partition's lock is a leader that processes it. A
// session that is not (a psql session left holding pg_advisory_lock, a
// pooler's server session on which a runner that went through a
// transaction-mode PgBouncer took the lock before it died, a runner frozen
// with its connections up, the backend of a killed process the server has
// not noticed yet) keeps the partition unled for as long as it lives, and
// every standby stands by behind it. A frozen runner's lock session lives
// only until it has idled for the lock's FreezeTimeout (30 s by default):
// the server ends it (idle_session_timeout; a live poller pings it, see
// advisorylock, "A frozen holder"), its locks are freed and the standbys
// take them at their next poll; resumed, the runner finds the session gone
// (the poller's Wait or next statement fails, every lease is lost) and its
// commits fenced by the new leader's epoch. Not so a session frozen idle
// in a transaction that its holder does not limit (package projection
// limits its batches', a rebuild's on its lock session among them, with
// idle_in_transaction_session_timeout), nor one whose FreezeTimeout is
// off (-1): those the
// warning below is for. With Config.HolderWarnAfter (the
// projection runner: three heartbeats, 30 s by default) the poller tracks,
// per partition it wants (a balanced one while its member is owed
// partitions, an unbalanced one always), since when it has been held by
// another session (the holder's pid, from the poll's pg_locks read for a
// balanced one); a partition free at a poll, led by this engine, or no
// longer wanted ends the run. Past HolderWarnAfter, and then at most once
// per HolderWarnAfter, one statement on the lock session (HeldLocks)
// reads the holder from pg_locks, whether a live instance's heartbeat
// lists the partition (leadership.HeartbeatLeaderJoin, fresh within
// HolderWarnAfter), whether the subscriber's rebuild lock is held
// (Config.RebuildKey: a rebuild leads without heartbeats, and replays its
// partitions one after another, holding the rest idle), the checkpoint's
// owner and age, and what pg_stat_activity shows this role of the holder
// (another role's backend shows only its usename and application_name
// without pg_read_all_stats). When neither a live instance nor a rebuild
// accounts for it, a WARN names the subscriber, the pid, that activity
// and the remedy (pg_terminate_backend, PgBouncer's RECONNECT): one WARN
// per holder (backend pid) and subscriber, naming every partition of the
// subscriber the last look found that pid holding for no live instance
// (partition, the lowest; partitions, their number; partition_list, the
// first eight), at most once a minute per holder, whatever the number of
// partitions (a dead runner's pooler session holding 64 partitions made
// 64 WARNs a minute on every standby when it was per partition); looks
// within the minute say it at debug level. An INFO per holder, naming
// the partitions that cleared together, follows once the runs end.
// A look that a partition's run past HolderWarnAfter causes also takes in
// the younger runs of balanced partitions of the subscriber held by the
// same pid (a runner's partitions may start waiting a poll or two apart);
// found unlisted, they are named in that WARN, but cause none of their
// own before their run is due (a live leader that has just taken one has
// not listed it in its heartbeat yet).
// The holder of an unbalanced partition is learnt at the first look, so
// its WARN waits for a second look to find the same pid (and a balanced
// one's whose pid changed starts over: a handover between live
// instances). A healthy fleet pays nothing: members get what they are owed
// within a poll or two, so no run lasts, and the statement never runs;
// an instance leading without heartbeats (Runner.RunUntilCaughtUp, annals
// tail --subscriber) does draw the WARN, which names such jobs as a
// possible holder, as does a live leader whose heartbeat has not been
// written for HolderWarnAfter (runners with a much longer
// HeartbeatInterval than this one's count as that).
// (projection/TestStandbyWarnsOfALockNoLiveInstanceHolds,
// TestStandbyDoesNotWarnOfALiveLeaderOrARebuild.)
//
// TakeOver (rebuilds) must win against lock sessions that poll every 20 ms
// and are woken by the release notice, so it does not poll: it waits in the
// lock's queue (advisorylock.AcquireQueued) on a connection of its own and
// fences the leader once it is queued. PostgreSQL grants a released lock to the queued
// session, and pg_try_advisory_lock fails while a session queues (pg_locks
// shows the queued request, so the balancer sees the partition as not
// free), so no standby can snatch it.
//
// The listener subscription is made, and LISTEN is confirmed active (or a
// poll interval has passed), before the first read, so an event committed
// while the leader catches up is either in a read or announced afterwards.
//
// Alternatives considered. (1) A connection per led partition (the
// previous design): simple fencing (the transaction dies with the lock's
// session), but 4 subscribers × 16 partitions cost 64 connections per
// process. (2) Heartbeat-based membership (the instances table): a takeover
// bound of 250 ms would need heartbeats every few tens of milliseconds per
// instance, and expiry must be conservative; a session lock ends exactly
// when the process does. (3) A coordinator (one leader assigning
// partitions): a second election, and an assignment that must be fenced
// too; here every member computes the same targets from the same pg_locks.
//
// # Reading a batch
//
// One statement returns up to BatchSize matching events after the cursor and
// a header from the same snapshot: the head (max global_sequence), the
// checkpoint's epoch and stop reason and the dead-letter counts. The
// header comes once, in a row whose event columns are NULL (the event rows
// carry NULL header columns), and every column comes in binary, decoded by
// the engine itself rather than through pgx's generic Scan (a connection
// that answers in text, e.g. over the simple protocol, is read through
// Scan). Event-type globs and the partition (annals.stream_partition of
// the partition key) are applied in SQL. If fewer than BatchSize events
// match, every event up to the head has been considered, so the batch
// covers ("Through") the head and the checkpoint may move past events that
// did not match; otherwise it covers through the last event returned. A
// subscriber that matches nothing still advances.
//
// # Reading ahead
//
// While a full batch is processed, the next events are read on the pool:
// while batches are quick (each of the recent ones processed within 50 ms),
// not one batch but about 4,000 events (aheadEvents, in whole batches) in
// one statement, cut into batches as the statement reads them, so that a
// partition far behind its head pays one round trip and one statement
// start per few thousand events, and the read overlaps the handling and
// committing of the batches before it. The batches read ahead are used in
// order, each only if it starts where the cursor is; the next read ahead
// leaves when the last batch known is full. A read ahead is made only when
// nothing about the partition is pending (no unresolved or released dead
// letters, no stop reason), and what was read ahead is discarded, and read
// again, as soon as a batch does not succeed completely (the processor
// returned less than its Through, or an error) or the processor called
// Lease.Changed (it wrote a dead letter or stopped the partition, which
// changes what the next read reports). A read ahead in flight is always
// waited for before the loop returns; it never moves a checkpoint. Memory:
// at most two reads ahead's events per partition (the batches pending and
// the read in flight). Batches read ahead carry their read's header, so a
// stop or a release of dead letters by an operator is seen once they are
// worked through: with quick batches well under a second; with slow ones
// (one batch read ahead) at the next batch, as before.

// # Committing while behind
//
// A batch read while its partition is behind the head (its Through is
// below the head the read saw) commits through Lease.CommitTx or
// CommitConn with synchronous_commit off for that transaction alone
// (AsyncCommit, queued before COMMIT in the same round trip): the commit
// returns without waiting for its WAL flush, so a catch-up is not paced by
// one flush per batch. Why it is safe: the batch's writes and its
// checkpoint are one transaction, which PostgreSQL's WAL orders and
// recovers atomically; a crash of the server loses a suffix of such
// batches (at most what the WAL writer had not written, about
// wal_writer_delay's worth) together with their checkpoints, and the next
// leader applies them again from the recovered checkpoint, so every event
// is still applied exactly once. The first batch that reaches the head
// commits synchronously, and its flush makes every earlier one durable:
// a CatchUp (a rebuild, RunUntilCaughtUp) returns durable (a batch that
// reaches the CatchUp's target counts as reaching the head). Two exceptions
// wait for the flush: a transaction whose handlers appended events (the
// newest event is then its own: appends hold the append lock until they
// end), which must be durable before anyone sees them, and a Subscription
// with SyncCommits (for read models something
// outside acts on as rows appear: asynchronous commits make rows visible
// before they are durable). TestCatchUpSurvivesACrashWithAsyncCommits
// (package projection) kills PostgreSQL mid catch-up and checks both the
// loss and the exactly-once recovery.
//
// An observer's checkpoint write (package projection) is a transaction of
// its own through CommitConn (BEGIN sent with it) and follows the same rule:
// while behind, it does not wait. Its events are handled outside the
// database, so a lost write means the events since the last durable one are
// delivered again: at least once still holds
// (TestObserverCatchUpSurvivesACrash).
//
// # Processing and fencing
//
// A Processor handles each batch and reports how far it got. Transactional
// projections run the batch and the checkpoint update in one transaction on
// the connection Lease.Do gives: a pool connection for a lease on the lock
// session (closed under the batch if the lock is lost), the lock's own
// connection for a TakeOver lease. The checkpoint update is fenced by the
// epoch the leader claimed (UPDATE … WHERE epoch = mine) and, on the lock
// session, by its holding the lock (see The lock session), so a process
// that lost leadership —
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
// # Commits whose outcome is unknown
//
// When the connection fails after a batch's COMMIT was sent (the network
// drops, the server ends the session while it waits for a synchronous
// standby), the batch may have committed although the processor got an
// error, and the engine's cursor is behind what is stored. Retrying from
// the cursor would apply those events a second time. Every read's header
// therefore carries the checkpoint's position (with its epoch, from the
// same row): in this leadership's epoch only this leadership's commits move
// the checkpoint, and every commit is at or below the position the
// processor reported, so a checkpoint past the cursor can only be such a
// commit that landed. The engine then goes on from the checkpoint (logged
// at WARN), drops what it read ahead, and reads again. It costs no round
// trip: the header row already joins the checkpoint row. Read ahead is not
// confused by it: a batch read ahead is used only once the cursor has
// reached its start, and its header was read before that.
//
// The header alone is not enough: the server may run the lost COMMIT late
// (the backend was descheduled, or the bytes sat in its socket), after the
// engine has read the checkpoint unmoved and while it applies the same
// events again on another connection. Both transactions carry the
// leadership's epoch, so the epoch alone would let both commit. So every
// fenced move also needs the checkpoint not to be past where the lease
// knows it (CommitFenced's "position <= known": the cursor, which the
// engine gives the lease before each call of the processor, raised by each
// commit since; an observer's batched checkpoint may be behind it, never
// past it). The two transactions serialize on the checkpoint's row: the
// later move waits for the earlier one's row lock and, under READ
// COMMITTED, re-checks the row as committed, finds it past known, and
// fails, so its transaction rolls back (checkpoint.ErrMoved). The engine
// then reads again at once, and the header has the checkpoint past the
// cursor. If the new attempt commits first, the late COMMIT's move fails
// the same way. TestCommitAfterALostCommitLanded makes the first case,
// and projection's TestCommitAnswerLostBeforeTheServerCommits the second
// (the backend stopped while the client sees its connection cut).
//
// Projections add the other half (package projection): a handler whose
// transaction's connection failed under it is not blamed for it (no
// attempt is counted, so an outage cannot dead-letter events); the batch
// is retried as after any database error.
//
// # Partitions
//
// A subscriber split into N partitions is N independent subscriptions, each
// with its own lock, checkpoint and cursor, reading only the events whose
// key's stream_partition is its number. The key is the stream ID by
// default (per-stream order), or the stream's category (the part of its ID
// before the first "-": per-category order), or a metadata field such as a
// tenant ID (per-tenant order): Subscription.PartitionBy. Each key lives in
// one partition and a partition reads in position order, so per-key order
// holds, and the instances share the partitions (Balanced leadership).
//
// The count and the key are the subscriber's layout, and it is fixed:
// with another one, events would move to partitions whose checkpoints were
// written for other events, behind them (skipped) or ahead (repeated).
// Before a subscription stands by, the engine records its layout in
// subscriber_layouts (CheckLayout, one statement): it inserts the layout
// unless the subscriber has one or has checkpoints from before layouts
// were recorded that show another count (partitions 0..k all checkpointed:
// k+1; with gaps: more than k); it replaces a recorded layout only while
// every checkpoint of the subscriber is at 0 (nothing was processed, or
// every partition was reset) and no rebuild owns one, and then bumps every checkpoint's epoch, fencing the old
// layout's leaders. Run, CatchUp and TakeOver refuse another layout with a
// *PartitionLayoutError before they claim anything, and every claim is an
// INSERT that adds or bumps the checkpoint only while the recorded layout
// is the subscription's: an engine that checked before a replacement
// cannot start a leader of the old layout. projection.Runner checks every
// subscriber before it starts (not the generations of blue/green read
// models, which start later and log a refusal). Unpartitioned subscribers
// are recorded as one partition by stream, whatever their key, which
// decides nothing. A new layout needs a new subscriber name.
//
// # Taking over (rebuilds)
//
// TakeOver makes an engine the leader of a partition at once, whoever leads
// it: it queues for the lock in PostgreSQL's lock queue, on a connection of
// its own, and once pg_locks shows its request it bumps the checkpoint's
// epoch (fencing the leader, which releases its lock at its next read or
// commit, at once when it waits idle: see Announcing a fence, and stands
// by). Queued first, it gets the lock the moment the
// leader lets go, ahead of every standby, the fenced leader included (its
// try as a standby fails while TakeOver queues; fencing before queueing
// left a window of a connection's set-up in which it could take the lock
// back and lead on under a new epoch: TestTakeOverQueuesBeforeItFences).
// If a standby that held the lock before TakeOver queued claims after the
// fence, TakeOver fences again (it checks every 10 ms), until a bounded
// wait ends with ErrTakeOverTimeout. The caller then Drives
// the lease through a target position and Releases it; meanwhile every other
// instance stands by. Package projection's Rebuild is built on it.
//
// TakeOver's fence and its claim each run in a transaction of their own
// (BEGIN, the timeouts, the claim and COMMIT in one round trip) whose
// lock_timeout and statement_timeout are 0, as its wait for the lock is
// (advisorylock.AcquireQueued): a lock_timeout that the role or the
// database sets as a production guard would otherwise make TakeOver fail
// whenever the checkpoint row is held for a moment (a batch's commit in
// flight), and a rebuild with it. Both are bounded by TakeOver's wait
// (TestTakeOverIgnoresServerTimeouts, TestTakeOverWaitBoundsTheClaim).
//
// # Announcing a fence
//
// A leader learns that it is fenced (its checkpoint's epoch moved: a
// TakeOver, an operator's checkpoint set, a layout replaced) when it next
// reads or commits. A leader waiting idle for new events would learn it
// only at its next poll (PollInterval: 1 s by default, set longer where
// NOTIFY or the WAL wakes leaders anyway), and a TakeOver queued for its
// lock would wait as long. So each statement that fences a leader also
// announces the fence, in the same statement (no round trip more), on the
// schema's fence channel "<schema>_fences" (checkpoint.FenceChannel), with
// a digest of the subscriber and partition as the payload
// (checkpoint.FencePayload): TakeOver's claims (ClaimAnnounced), the bumps
// of a layout replacement (RecordLayout), and package checkpoint's Set and
// Move (annals checkpoint set, the console). PostgreSQL delivers it when
// the fencing transaction commits. The process's Listener LISTENs to that
// channel on its one connection, beside the events channel, and passes
// each announcement to the local leader of that partition alone, as a
// signal that cuts whatever wait it is in short (idle, a stopped
// partition's wait, a retry's backoff): it reads, finds the epoch changed,
// releases its lock (announced) and stands by, and a TakeOver queued for
// the lock gets it. Measured (TestFencedIdleLeaderLetsGoAtOnce, a leader
// with a PollInterval of 30 s, -race): the idle leader lets go 5-50 ms
// after the fence, and TakeOver completes in 30-60 ms, where it timed out
// after 10 s before (the leader would have let go at its poll).
//
// The announcement reaches the leader through the engine's Listener, not
// through its Waker, so it works whatever the Waker: package walsource's
// wakes a leader only for events of its own partition, and a fence writes
// no event. Alternatives considered: a NOTIFY on the events channel wakes
// every subscription of every process for one fence, and no WAL-woken
// leader; the lock session's LISTEN on "<schema>_locks" (release
// announcements) would tell the session that something happened, not which
// partition was fenced (advisorylock.Standby's Wait drops the payload), and
// the session would have to read the epoch of every partition it leads to
// find out; a trigger on the checkpoints table would run at every batch
// commit.
//
// An announcement is a hint, like every signal: the woken leader reads its
// epoch again (a stale one costs one read). One that is missed (an engine
// without a Listener; a Listener reconnecting, which then signals every
// leader, as it does for events) is noticed at the next poll, as before. A
// lock session's claim is not announced: it took a free lock, so no leader
// is left to tell.
//
// # Ephemeral subscriptions
//
// A subscription marked Ephemeral takes no lock and stores no checkpoint: it
// starts after a given position and keeps its cursor in memory (annals tail
// without --subscriber).
package catchup
