// Package projection runs the consumers of the annals log: projections that
// build read models in the same database, exactly once, and observers that
// perform side effects elsewhere, at least once.
//
//	reg := eventstore.NewRegistry()
//	eventstore.MustRegister[Deposited](reg, "account.deposited")
//
//	p := projection.New("balances", reg)
//	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Deposited]) error {
//		_, err := tx.Exec(ctx, `INSERT INTO balances VALUES ($1, $2)
//			ON CONFLICT (account) DO UPDATE SET amount = balances.amount + $2`, e.StreamID, e.Data.Amount)
//		return err
//	})
//
//	runner, _ := projection.NewRunner(pool, nil)
//	_ = runner.Register(p, nil)
//	_ = runner.Run(ctx) // until ctx ends; RunUntilCaughtUp for tests and batch jobs
//
// # Guarantees
//
//   - One active processor per subscriber (or partition) across every
//     process, elected with an md5-keyed advisory lock; the others stand by
//     and take over within tens of milliseconds when the leader dies. The
//     processes running a partitioned subscriber share its partitions
//     fairly (⌊P/N⌋ or ⌈P/N⌉ each; Options.Partitions, PartitionBy), and a
//     process holds all its locks on one connection (package catchup,
//     "Balanced leadership" and "The lock session").
//   - Projections: each batch of events and the checkpoint commit in one
//     transaction (on a pool connection), fenced by the leader's epoch and
//     by its lock session still holding the lock. A read-model write is
//     applied exactly once; a leader that has lost its lock cannot commit.
//   - Observers: at-least-once; Handle gets the event (use e.ID to make side
//     effects idempotent). Checkpoints are written every CheckpointEvery
//     events or CheckpointInterval (also while idle), so a crash of the
//     runner re-delivers at most that many events; a graceful shutdown
//     re-delivers none. So does a lost lock session while the process
//     lives (its connection cut, the process paused): the checkpoint not
//     yet written cannot be written without the lock, and whoever leads the
//     partition next, this very process too, re-delivers from the stored
//     one. While an observer is behind the head its writes do
//     not wait for their WAL flush, so a crash of PostgreSQL itself during
//     a catch-up can also re-deliver what it handled in the moments before
//     (Options.SyncCommits makes every write wait).
//   - Every subscriber sees each stream's events in stream-version order,
//     with partitions too.
//   - Failures are recorded, never lost: each failed attempt (an error, a
//     panic with its stack, a HandlerTimeout, a projection's transaction
//     that cannot commit: see "Failures at commit") is a row in failures,
//     retried by the subscriber's RetryPolicy (3 retries, 1 s ×2 up to 60 s
//     by default; annals.Permanent errors are not retried, nor is an event
//     whose data a typed handler cannot decode into its type: a JSON error,
//     eventstore.ErrDecode, is permanent, a failed upcast is retried). The
//     attempts count across processes, and their rows go when the event is
//     handled, whichever leader handles it: a new leader takes over the
//     failed attempts of the events ahead of its checkpoint, and deletes
//     those left at or below it that no dead letter keeps. When
//     the policy is spent the event becomes a dead letter, committed with
//     the checkpoint move, and the DeadLetterPolicy applies: ParkStream
//     (projections' default) holds back the rest of the stream in order,
//     SkipEvent (observers' default) moves on, Stop halts the partition.
//     Operators act with package deadletter or annals dlq; released entries
//     are re-delivered by the live leader, in order, each holding its
//     dead letter's row lock until it is resolved (for an observer, for at
//     most its HandlerTimeout and a few seconds), so that an operator's
//     skip meanwhile waits and never marks skipped an event that was
//     delivered. An entry whose event
//     is no longer in the log (a hard delete, truncation or retention, then
//     a scavenge) cannot be delivered: the leader marks it skipped, keeping
//     its last error, and logs one WARN; deadletter's Retry and Skip do the
//     same and list it in Change.Gone.
//   - Telemetry: a span per batch ("annals.batch"); with Config.HandlerSpans
//     also one per handler call, linked to the append that produced the
//     event (with Config.HandlerSpanParent, a child of it); and the metrics
//     listed in internal/telemetry.
//
// # Failures at commit
//
// Some failures of a projection's batch show only when its transaction
// commits: a deferred constraint (DEFERRABLE INITIALLY DEFERRED) is checked
// at COMMIT, and a handler that ignores the error of a failed statement
// returns nil in a transaction PostgreSQL has aborted, whose commit then
// fails with 25P02 ("current transaction is aborted"). When PostgreSQL
// answers a batch with such an error after every handler returned nil, the
// runner narrows the batch down: it applies the first half of the failing
// events in a transaction of their own (with the fenced checkpoint move,
// like every batch), and halves whichever part fails again, until one
// event's own transaction fails. That is the event's failure: recorded,
// retried and dead-lettered like a handler's error, its message saying
// that its transaction could not commit, with PostgreSQL's error (and, for
// 25P02, that its handler ignored the error of an SQL statement). The
// events before it commit on the way, each exactly once, and the events
// after it go on in one transaction again. Only what one event's writes can
// cause is blamed on an event: an integrity constraint violation (class
// 23), a data exception (22) or a raise_exception (P0001) from a deferred
// trigger, and 25P02. Anything else (no answer, the connection's or the
// server's failures, a permission denied on the checkpoint, an
// idle-in-transaction timeout, a serialization failure or deadlock) is
// retried as a batch after RetryBackoff, as any error besides a handler's.
// A released dead letter whose re-delivery cannot commit is open again, as
// after a handler error.
//
// Nor is a handler's error blamed on its event when the transaction's
// connection failed under it (the server ended the session, the network
// dropped): the transaction went with the session, nothing of it was
// applied, and the batch is retried after RetryBackoff without counting an
// attempt, so an outage cannot dead-letter events or park streams. A
// handler that runs out of HandlerTimeout is still to blame (pgx closes the
// connection of a query whose context ends). A batch whose COMMIT was sent
// when the connection failed may have committed: the engine finds that out
// at its next read and goes on from the checkpoint, so those events are not
// applied twice (package catchup, "Commits whose outcome is unknown").
//
// # A leader frozen in a transaction
//
// A leader that stops running with its connections up (SIGSTOP, a paused
// container) loses its partitions once its lock session has idled for the
// lock's FreezeTimeout (advisorylock, "A frozen holder"). Its batch's
// transaction, on a connection of the pool, would still hold the row locks
// of what its handlers wrote, and the new leader's handlers that write the
// same rows would wait for them, fail on their HandlerTimeout and, in the
// end, dead-letter events that are not to blame. So the transactions a
// leader opens on its lease's connection to run handlers or to record a
// dead letter (its batches, a rebuild's batches on the rebuild's lock
// session, re-deliveries) begin with idle_in_transaction_session_timeout
// set to HandlerTimeout plus FreezeTimeout (local to the transaction, in
// BEGIN's round trip or pipelined with the first statement; a shorter
// setting of the session's own stays). The limit is per gap between two
// statements and HandlerTimeout per handler call, so between two handler
// calls a batch whose transaction has sent nothing for a third of
// FreezeTimeout pings it: a live batch idles at most that plus one call.
// A call that returns after the transaction has idled for HandlerTimeout
// plus two thirds of FreezeTimeout (its handler ignored its context) may
// have lost its session to the server: it is a timed-out attempt. Only a
// frozen process's transaction idles for the whole limit; the server ends
// its session, and the new leader applies the event once it is gone. No
// limit is set without a HandlerTimeout, or with FreezeTimeout -1.
//
// # Read-model setup
//
// A projection declares what its read model needs with Typed.OnSetup (or by
// implementing Setupper): a versioned setup function, typically
// Statements("CREATE TABLE IF NOT EXISTS …"). Run and RunUntilCaughtUp (and
// Runner.Setup, which they call) run it before the projection first runs,
// and a rebuild before its Reset, in a transaction that first takes a
// transaction-scoped advisory lock on the projection's setup key, then
// checks and updates the version recorded in the read_model_setups table
// (EnsureSetup). So it runs once per version per database, never
// concurrently with itself, even when instances start at once; a failed
// setup records nothing and the runner does not start. Bump the version to
// run a changed setup once more. The setup transactions are READ COMMITTED
// whatever the session's default_transaction_isolation says: under
// REPEATABLE READ or SERIALIZABLE, an instance that waited for the lock
// would keep the snapshot it took before the wait, miss the record of the
// setup it waited for and run the setup again. EnsureSetup called with
// such a transaction fails with a *SetupIsolationError (ErrSetupIsolation).
//
// # Rebuilding a projection
//
// Runner.Rebuild replays one registered projection from the start of the log
// into a cleared read model while the service keeps running (mount the
// commands of package projection/projectioncmd to do it from the command
// line):
//
//	err := runner.Rebuild(ctx, "balances", &projection.RebuildOptions{
//		OnProgress: func(p projection.RebuildProgress) { log.Printf("%d/%d", p.Done, p.Total) },
//	})
//
// The projection must be a Resetter (a typed projection: call OnReset).
// Rebuild first takes the projection's rebuild lock (a session advisory
// lock on RebuildLockKey, held for the whole run): a second rebuild of the
// same projection, from any process, fails at once with ErrRebuildRunning.
// It fences the live leader of every partition (it bumps the checkpoint's
// epoch, as annals checkpoint set does), takes the partitions' locks as the
// leaders let go, and holds them: live instances stand by. A leader lets go
// at its next read or commit, or within about a second while it waits to
// retry a failing event (it checks its epoch while it waits, and a fenced
// leader can record no further failed attempt), so rebuilding to fix a
// poison event does not wait out the retry policy. In one transaction it
// calls Reset, sets the checkpoints to 0, settles the subscriber's dead
// letters as resolved (the replay delivers those events again; one that
// fails again is open again) and
// deletes its recorded failed attempts, so that each event is retried by
// the policy afresh during the replay; then it replays through the head,
// RebuildOptions.BatchSize events per transaction (5,000 by default) each
// committed with its checkpoint, reporting progress, and releases each
// partition's lock when done, so that a live instance takes over from the
// rebuilt checkpoint. A rebuild that dies midway loses nothing: the live
// instance takes the freed lock and continues the replay from the last
// committed batch.
//
// A deploy that adds a handler (an event type the projection did not handle
// before) needs a rebuild (blue/green: a new BlueGreen.Version): the
// new version continues from the old one's checkpoint, which passed the
// earlier events of that type unread, so the new handler sees only the
// events appended after the deploy.
//
// # Inline or asynchronous
//
// A Projection can also run inline: listed in eventstore.Config.Inline, it
// is applied in the transaction of each append through that Store, before
// the append takes the log's ordering lock (see package eventstore), and
// its read model is never stale for the writer. Choose:
//
//   - inline when a writer must read its own write at once (a uniqueness
//     check, a balance shown right after the command) and every append of
//     the projection's event types goes through one Store configured with
//     it. The appender pays for the handlers (and a stream-version read) in
//     its own latency; a failing handler fails the append; no runner, lock
//     or checkpoint is involved.
//   - asynchronous (the Runner) when the projection must see every event
//     however it was appended, when its handlers are slow or may fail
//     without blocking writers, or when it reads other read models. Use
//     Await for read-your-writes.
//
// An inline projection is rebuilt through a Runner like any other
// (Runner.Rebuild, with the projection registered under its name), and
// the rebuilt read model equals the one built inline as long as the
// handlers do not store GlobalSequence or RecordedAt, which inline handlers
// do not know (projection/TestInlineProjection rebuilds one built by
// concurrent writers).
//
// # Read-your-writes: Await
//
// A writer that must read an asynchronous projection's result waits for it:
//
//	res, err := store.Append(ctx, "acct-1", eventstore.Any, eventstore.NewEvent(Deposited{Amount: 5}))
//	err = runner.Await(ctx, "balances", res.Events[len(res.Events)-1].GlobalSequence)
//
// Runner.Await (or an Awaiter, or the function Await, for a process that
// does not run the projection) returns once the checkpoint of the
// partition that position's event belongs to (by the subscriber's recorded
// partition key: stream, category or metadata field) has reached position,
// or, when ctx ends first, a *BehindError naming the checkpoint, the target
// and the number of events between them (and the partition's stop reason
// when the Stop policy halted it). A checkpoint that passed position
// without applying its event is no success: when the event at position is
// an open or skipped dead letter of the subscriber (it failed, or was
// parked behind a failure of its stream), Await returns a
// *DeadLetteredError (ErrDeadLettered) instead of nil; one that an operator
// released is waited for until it is re-delivered. The dead letter is
// looked up only once the checkpoint has passed, in the statement that
// reads it. It is woken, not polling: after
// each batch commit the runner NOTIFYs the schema's checkpoint channel
// ("<schema>_checkpoints", payload "position:partition:subscriber") in the
// same round trip, as a transaction of its own that does not wait for its
// WAL flush (a NOTIFY inside the batch's transaction would hold
// PostgreSQL's notification-queue lock, which appends take too, through
// that flush). An Awaiter listens on one connection for all its waiters,
// only while some wait, and reconnects when it loses it; every waiter also
// reads the checkpoints every AwaitOptions.PollInterval (1 s), which
// covers a lost notification and the moves that send none (a dead letter,
// an observer's batched checkpoint, a rebuild, annals checkpoint set).
// For a blue/green projection Await waits for the live generation's
// checkpoints (subscriber <name>#g<N>: what readers see), and a cut-over
// or rollback during the wait is followed at the next poll; it returns
// only if the generation whose checkpoints reached the position is still
// live after they were read. A rollback after it returned takes readers
// back to a generation that may lack the event until its runners catch it
// up.
//
// # Blue/green read models
//
// A rebuild in place shows readers a partial read model for the whole
// replay. A projection registered with Options.BlueGreen instead keeps its
// read model in one PostgreSQL schema per generation (rm_<name>_g<N>),
// listed in the schema's read_model_generations table, and readers query
// views in BlueGreen.ReaderSchema (public by default), one per relation of
// the live generation (SELECT * FROM rm_<name>_g<N>.<relation>). When a
// schema rm_<name>_g<N> already exists as the generation is created
// (another annals schema of the database, Config.Schema, runs a blue/green
// projection of the same name, or left one behind), the generation takes
// rm_<name>_g<N>_<tag> instead, tag being 8 hex digits of the MD5 of the
// annals schema's name; so does the loser of two annals schemas creating
// the name at once. Generation.Schema (ListGenerations) says which. Each
// generation is a subscriber of its own (<name>#g<N>: own checkpoints, own
// lock; Register refuses every name ending in #g and digits, which would
// share them), and its handlers and setup run with the transaction's
// search_path set to its schema first, so the same code with unqualified
// table names writes into whichever generation it runs for:
//
//	p.OnSetup(1, projection.Statements(`CREATE TABLE balances (…)`))
//	_ = runner.Register(p, &projection.Options{BlueGreen: &projection.BlueGreen{Version: 2}})
//	cut, err := runner.RebuildBlueGreen(ctx, "balances", nil) // or: projections rebuild balances
//
// A generation is building, live, retired or dropped:
//
//	(none) ──first run──▶ live
//	building ──cut-over──▶ live ──cut-over of a newer one, or rollback──▶ retired
//	retired ──rollback──▶ live
//	retired ──after Retention (janitor)──▶ dropped (schema gone)
//
// RebuildBlueGreen registers a building generation for the registered
// Version (or continues one), creates its schema and runs the setup in it,
// takes its partitions' locks and replays from its checkpoints (0 for a new
// one) through the head, while the live generation's leaders keep updating
// the live one. The cut-over is one transaction: it locks the live
// generation's checkpoint rows (FOR UPDATE waits for a batch in flight,
// whose checkpoint update holds the row, and holds the next), then the new
// one's; if a partition of the new one is below the old one's highest
// position it gives up (ErrCutoverBehind), catches up to the new head and
// tries again, at most BlueGreen.CutoverAttempts times. Otherwise it drops
// the old views and creates the new ones (transactional DDL, the grants on
// the views carried over), stops the old generation where it is (its
// checkpoints get a stop reason and a new epoch: a batch that waited on the
// row lock is fenced and rolls back), and flips the states. Readers' views
// take an exclusive lock only for that transaction: a reader waits at most
// its length (or sees the old model), and every answer is the complete model
// of one generation at some position, and the new one at or after the
// position of the old one. A generation with unresolved dead letters (open,
// or released and not yet re-delivered) is never cut over: it lacks their
// events, so the cut-over refuses (ErrCutoverDeadLetters) and waits until
// an operator retries or skips them on its subscriber. The old generation
// is not kept warm: it stays exactly as readers last saw it, for Rollback,
// which swaps the views back and lets it resume from its checkpoints (the
// runners of its version catch it up). A crash anywhere loses nothing: the
// replay continues from the new generation's checkpoints, and a cut-over
// either committed or did nothing.
//
// Runners run the generations of their own Version that are live or
// building, and check the registry every BlueGreen.CheckInterval: they
// start and stop generations as their states change, try the cut-over of a
// building generation that has caught up, and drop retired generations
// after BlueGreen.Retention. With BlueGreen.AutoRebuild, the first runner of
// a new Version (a deploy) registers the building generation itself; every
// runner of that version runs it (its locks elect one leader per
// partition), while the instances of the old version keep serving the old
// generation until the cut-over, and then stop it.
//
// With Config.ReadPool, RebuildBlueGreen reads the bulk of its replay
// from the replica, and only what decides the cut-over from the primary.
// Each round of its replay outside the cut-over (settling, then
// approaching the head) replays first from the replica, through the head
// the replica shows (a prefix of the log: positions are commit order), and
// then from the primary, through the primary's head, the events the
// replica had not replayed yet; both start at each partition's committed
// checkpoint, so none is skipped or replayed twice, and the batches' fence
// (epochs), stop reasons and dead letters are read on the primary either
// way. The primary's head says how far each round goes and when what is
// left is short enough to try the cut-over, so a lagging replica cannot
// make the rebuild stop short: at worst the primary replays more of the
// tail. And the catch-up inside the cut-over transaction reads from the
// primary: it must reach the live generation's locked position within
// CutoverLockTimeout while the live generation is held still, and a
// replica that does not show that position yet would keep it waiting
// until the deadline, at every attempt. So a replica far behind, or
// paused, at cut-over time neither holds the cut-over back nor freezes the
// live read model for longer than without it, and the events it lacks are
// in the new generation all the same (projection/TestBlueGreenReadReplica).
// The progress count (one scan up to the head) stays on the primary. Nor
// does a failing replica hold the rebuild back: a read on it that fails
// (the replica down, its pool closed), or that a standby behind the head
// read on another one (a ReadPool over several hosts) does not answer
// within RetryBackoff (at least 100ms; catchup.Config.ReadPoolWait), ends
// the replica's part of the round for every partition, and the primary
// replays the rest of it from the committed checkpoints; the next round
// tries the replica again (projection/TestBlueGreenReadPoolGoneMidReplay).
// A partition stopped by a dead letter (the Stop policy) in the replica's
// part does not keep the others from the primary's.
//
// A cut-over never goes back to an older Version than the live one's: the
// cut-over transaction compares them under the same lock, and a building
// generation of an older version (an interrupted rebuild finished late, an
// old instance restarting during a rolling deploy) is retired instead,
// never having been live (ErrCutoverOlderVersion; RebuildBlueGreen of an
// older version is refused at once). Going back is Rollback's, an
// operator's decision. A cut-over's fences are announced, so the old
// generation's idle leaders let go at once.
//
// The algorithm, with its state machine, is described in package catchup.
package projection
