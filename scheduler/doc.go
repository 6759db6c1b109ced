// Package scheduler appends events later: timers (one delayed append, e.g.
// a saga's payment deadline) and cron tasks (an event at every tick of a
// cron expression). Both live in the database, and each timer and each
// cron tick fires exactly once however many processes run a dispatcher.
//
//	sched, _ := scheduler.New(store, nil)
//	id, _ := sched.Schedule(ctx, tx, time.Now().Add(30*time.Minute), "order-17",
//		eventstore.EventData{Type: "order.payment_deadline", Data: deadline})
//	_ = sched.AddTask(ctx, scheduler.Task{Name: "nightly", Spec: "30 2 * * *",
//		TimeZone: "Europe/Berlin", StreamID: "reports"})
//	runner.AddService("scheduler", sched) // or go sched.Run(ctx)
//
// docs/scheduler.md is the user guide.
//
// # Time
//
// Every due-time decision uses Config.Clock, never the database's now():
// the dispatcher passes Clock.Now() into its queries. A test can therefore
// drive timers and ticks with a fake clock (one with projection.Clock's
// method set serves a runner and a scheduler). The dispatcher sleeps with
// Clock.After until the next due time (at most PollInterval); a fake clock
// should fire After channels when it is advanced. Two waits are in wall
// time because they are not about due times: the back-off after a database
// error, and ContentionBackoff, when due work is held by another dispatcher.
//
// A cron task's last tick more than a minute after a dispatcher's clock was
// recorded by a dispatcher whose clock ran ahead; that dispatcher fires the
// task by its own clock instead of waiting for real time to reach it (see
// taskRow.anchor; cron_ticks keeps the ticks unique).
//
// # Timers
//
// Schedule validates and encodes the append at once (eventstore.Encode: bad
// input is an error then, and event IDs are fixed), and stores it in the
// timers table, in the caller's transaction if one is given: the timer
// exists only if that transaction commits. The encoded append goes to the
// json column payload_json (since migration 0033; the jsonb column payload
// rewrote it, and spelled 1e131000 out in 131,001 digits, and keeps the
// payloads of timers stored before, which fire from there): it is kept byte
// for byte and sent as stored when the timer fires, where eventstore
// measures each event against MaxEventBytes again. That append is an
// append_events_json call (migration 0035), which stores each event's data
// and metadata as sent, as every append does. Schedule refuses a number
// jsonb cannot hold (beyond numeric's range) where the append would refuse
// it at every firing, in metadata and in data holding "$personal" or a \u
// escape (as migration 0032 has append_one and append_batch refuse it): Go
// finds the numbers that might be (payload.go), PostgreSQL's jsonb_storable
// decides. The same statement sends a NOTIFY on
// TimersChannel(schema), which PostgreSQL delivers at commit. A timer whose
// time has passed already fires at once.
//
// A timer is pending until it fires, is cancelled, or fails for good:
//
//	pending --due, append ok--> deleted (fired, in the same transaction)
//	pending --due, append fails--> pending, attempts+1, due_at = now + backoff
//	pending --MaxAttempts failures, or a permanent error--> failed (kept, not retried)
//	pending or failed --Cancel / CancelOwned--> deleted
//
// Permanent errors are those a retry cannot fix: an encoded append that is
// malformed (eventstore.ErrInvalidEvent), an event ID stored already as a
// different event, an unknown type. A wrong expected version is retried
// (the stream may yet reach it). The backoff starts at RetryBackoff and
// doubles up to MaxRetryBackoff. A serialization failure or a deadlock
// (40001, 40P01) is a race lost, no failure of the timer's: it is not
// counted among its attempts (timers.lost_races counts them), and the timer
// is retried after RetryBackoff, doubled for each race lost in a row up to
// MaxRetryBackoff. Only 10 × MaxAttempts races lost in a row count as an
// attempt (the last of them), so a timer that never wins a race ends failed
// instead of being retried forever. Failed timers show in Timers,
// TimerStats and `annals schedule list`; cancel them to remove them.
//
// # The dispatcher
//
// Run loops over passes (FireDue is one pass). A pass claims due timers in
// batches, each in one transaction (eventstore.Store.Transact, READ
// COMMITTED whatever the session's default isolation, through
// internal/txopts: under REPEATABLE READ a claim's append failed to
// serialize whenever another append changed its stream meanwhile): first one
// statement deletes up to BatchSize timers whose due_at is at or before the
// clock's now, selected FOR UPDATE SKIP LOCKED, and returns them; then every
// claimed timer's append and the COMMIT are sent together, in one pipelined
// round trip. So:
//
//   - Exactly once: a timer's delete and its append commit together or not
//     at all. Two dispatchers never claim the same row (the row lock), and
//     a row deleted by a committed claim is gone for everyone after.
//   - Several dispatchers share the work: SKIP LOCKED makes each take rows
//     the others do not hold, without waiting.
//   - A crashed claimer's transaction aborts with its session; its rows are
//     unlocked and undeleted, claimable by the next pass of anyone. A hung
//     one's too, after Config.ClaimTimeout: each claim transaction begins
//     with SET LOCAL idle_in_transaction_session_timeout (BoundClaim,
//     pipelined with the claim), so the server ends a session that sits
//     idle in a claim longer than that.
//   - Re-running an append is harmless anyway: the encoded events have
//     fixed IDs, and the log treats a re-append of stored events as a no-op.
//
// What a claim holds, and for how long. The claimed timer rows are locked
// (invisible to other dispatchers, which skip them) from the claim's DELETE
// to its COMMIT: two round trips. The log's ordering lock, which every
// append of the database needs, is taken by the claim's first append and
// released by its COMMIT, both in the last round trip: it is held only for
// the server-side time of the claim's appends (at most BatchSize) and the
// commit, never across a network round trip. The one exception is a
// pipeline whose append fails: the failed transaction keeps the lock until
// the ROLLBACK that follows at once (one more round trip).
//
// If any append of a batch fails, the batch is rolled back and its timers
// are fired one at a time, each in a transaction shaped the same way (claim
// the row, then its append and the COMMIT in one round trip), so a failing
// timer records its failure (in a separate statement that takes no append
// lock) and the others fire.
//
// Order. Within one claim, timers are appended in due order (then by ID);
// the claim sorts the deleted rows itself, since DELETE … RETURNING keeps no
// order. Across claims there is no order: with several dispatchers (or
// BatchSize smaller than the due backlog), two timers of one stream claimed
// by different claims may be appended in either order, whatever their due
// times. Use the expected version (Timer.Expected) where order matters.
//
// Between passes the dispatcher sleeps until the earliest due timer or cron
// tick (by the clock), at most PollInterval, and wakes early on a NOTIFY
// (a timer scheduled by any process), on AddTask or ResumeTask in this
// process, and whenever its LISTEN connection (its own, not the pool's) is
// re-established after a loss. When due work exists that another
// dispatcher holds, it looks again after ContentionBackoff.
//
// Cancel and CancelOwned wait for a dispatcher that holds a timer it is
// firing: when its claim commits, the timer fired and is not counted; when
// it rolls back (the append failed), they delete the row before the
// dispatcher takes it again or records the failure. So a timer they did
// not delete has fired: it is not put back to fire later. The wait runs in
// a transaction of its own, or in a savepoint of the caller's, with
// lock_timeout = ClaimTimeout (the caller's lock_timeout is put back
// after). It ends in ErrTimerBusy, nothing cancelled and the caller's
// transaction still usable, if the dispatcher does not let go in that
// time, or if it waits for a lock the caller's transaction holds: after an
// append in it, the log's ordering lock, a deadlock that PostgreSQL ends
// after deadlock_timeout (1 s by default) by failing one of the two. If
// the dispatcher is the one it fails, the timer is cancelled; if the
// savepoint, ErrTimerBusy, and the timer fires when the caller's
// transaction ends (roll it back and try again to cancel it).
//
// # Cron tasks
//
// A Task is stored in cron_tasks by AddTask (an upsert; re-adding the same
// definition, as every process does at start, changes nothing) and its
// Event factory is registered in the process: a dispatcher fires only the
// tasks registered in its process, so a process that lacks a task's code
// never fires it. Specs are robfig/cron expressions with an optional
// seconds field and descriptors, read in the task's IANA time zone.
//
// The due ticks of a task are those after its anchor — the later of its
// last fired tick and active_since (set when the task is created, when its
// definition changes, and when it resumes, so no tick from before those
// moments ever fires) — up to the clock's now. A pass fires at most one
// tick per task, the latest due one. It first calls the task's Event func
// for that tick (computed from the row read without a lock), outside any
// transaction: the func is user code and may be slow, and inside the claim
// that time would count as idle in transaction (ClaimTimeout). Then one
// transaction: lock the task row FOR UPDATE SKIP LOCKED (a task another
// dispatcher is firing is skipped), re-read it and recompute the due tick
// (if it is not the one the event was made for, because another
// dispatcher fired it or the task changed meanwhile, nothing fires and the
// next pass looks again), insert the (task, tick) row into cron_ticks
// (unique: a tick recorded once is never fired again), advance last_tick;
// then the event's append and the COMMIT go in one round trip, so a tick
// holds the log's ordering lock no longer than a claim does. The event's
// ID defaults to TickEventID(task, tick), a UUIDv5, as a third guard. So
// an Event func may be called for a tick that another dispatcher fires (or
// more than once for one tick, after a failed attempt): it should build
// the event, not act on its own.
//
// Missed ticks. A tick is on time while it is at most MissedGrace (default
// 1 min) old when a dispatcher gets to it, so a tick fired a few hundred
// milliseconds (or seconds) late is not missed. If the latest due tick is
// on time it fires, whatever the policy, and any older due ticks (missed
// during an outage) are dropped. If even the latest due tick is older than
// the grace, every due tick was missed: FireLatest fires the latest one
// once; SkipMissed fires none. Either way the task then waits for its next
// tick.
//
// Failures. An attempt to fire a tick fails when the task's Event func
// returns an error or panics (the panic is recovered; the error names the
// task and the panic value), when its event is invalid, or when the
// database refuses the tick's transaction. The dispatcher logs one error
// line and tries the task again after RetryBackoff. For the task's own
// failures (its Event func failed or panicked, or its event cannot be
// appended: invalid, of an unregistered type, with an ID stored as a
// different event, to a deleted stream) the wait doubles with each one, up
// to MaxRetryBackoff (default 10 min); a successful attempt resets it. So a
// task whose every attempt fails (a bug, an event that can never be
// appended) is tried, and logs, about log2(MaxRetryBackoff/RetryBackoff)
// times in its first MaxRetryBackoff and then once per MaxRetryBackoff,
// instead of once per RetryBackoff forever; the other tasks fire
// meanwhile. Failures of the connection or the server (an outage, a
// timeout, a serialization failure) are retried after RetryBackoff
// without growing the wait, so that the task fires as soon as the database
// is back, not up to MaxRetryBackoff later. The back-off is kept in each
// process. A
// retry fires the latest tick due by then (not each tick that fell
// meanwhile); if that is older than MissedGrace, it was missed and the
// task's MissedPolicy applies.
//
// Time zones and DST. A task's ticks are the instants whose wall time in
// its zone matches the spec: on the day clocks spring forward, a wall time
// that does not exist (02:30 in Europe/Berlin on 2026-03-29) has no tick;
// on the day they fall back, a wall time that happens twice (02:30 on
// 2026-10-25) has two ticks, one hour apart in UTC. This holds for changes
// of other than a whole hour too (Australia/Lord_Howe's 30 minutes, where
// robfig/cron's own Next skipped 02:00 +10:30 on 2026-04-05): zonedSpec
// reads the spec at one fixed offset per period of the zone. Hourly and
// finer specs stay evenly spaced in UTC across whole-hour changes. Use
// TimeZone "UTC" for exactly one tick per day.
//
// Fired tick rows are pruned after TickRetention (default 7 days).
package scheduler
