// Package saga runs process managers (sagas) on the annals log: long-running
// processes that react to events, keep a typed state per instance and emit
// effects (events, timers), exactly once.
//
//	s := saga.New[OrderState]("order-fulfilment", reg)
//	saga.On(s, func(e eventstore.Envelope[OrderPlaced]) string { return e.Data.OrderID },
//		func(ctx context.Context, inst *saga.Instance[OrderState], e eventstore.Envelope[OrderPlaced]) error {
//			inst.State.Total = e.Data.Total
//			id, err := inst.ScheduleAfter(ctx, 15*time.Minute, "order-"+inst.ID(), eventstore.NewEvent(PaymentDeadline{OrderID: inst.ID()}))
//			inst.State.Deadline = id
//			...
//			_, err = inst.Append(ctx, "payment-"+inst.ID(), eventstore.NoStream, eventstore.NewEvent(RequestPayment{...}))
//			return err
//		})
//	sched, _ := scheduler.New(store, nil)
//	_ = saga.Register(runner, s, &saga.Config{Store: store, Scheduler: sched})
//	_ = runner.Run(ctx)
//
// A saga is any Saga[S]: Name, Correlate (which instance an event belongs
// to, or none) and Handle. New and On assemble one from typed handlers.
//
// # How it works
//
// Register adds the saga to a projection.Runner as a transactional
// projection (subscriber name = saga name), so it gets the runner's leader
// election, fencing, retries and dead letters. For each event, inside the
// batch transaction the runner opened on a pool connection (catchup
// Lease.Do; the leader's lock session only holds the lock):
//
//  1. Correlate routes the event to an instance ID (or skips it).
//  2. The instance's row in saga_states (saga, correlation_id) is loaded:
//     state (JSON), version, completed. A completed instance ignores the
//     event. No row: a new instance with the zero state.
//  3. Handle runs. Its effects run in the same transaction: Append
//     (eventstore.AppendTx), Schedule and Cancel (the scheduler's, with the
//     transaction).
//  4. The state is saved: INSERT for a new instance, else UPDATE ... WHERE
//     version = the loaded version (optimistic concurrency; a mismatch is
//     ErrConflict). Completing also cancels the instance's pending timers
//     (scheduler.CancelOwned with owner Owner(name, id),
//     "saga:<len(name)>:<name>:<id>": the length keeps the tags of two sagas
//     apart even when names and IDs contain colons; a tag that cannot be a
//     timer's owner, over scheduler.MaxOwnerBytes or with a control
//     character, is replaced by "saga-sha256:<hex>", its hash, so that any
//     instance ID can schedule timers, and the timers an earlier annals
//     stored under the plain tag are cancelled too).
//
// The runner commits the batch's states, effects and checkpoint together, so
// a crash anywhere re-runs whole events or none: an effect is never applied
// twice nor lost. Any error rolls the batch back from the failing event on;
// the runner retries the event by its RetryPolicy and then dead-letters it.
// Errors (and panics, recovered as errors) of Correlate and Handle are
// wrapped with the saga's name and the instance ID.
// Bad correlation (ok with an empty ID, an event a typed saga cannot
// decode) and a state that cannot be decoded or encoded are marked
// annals.Permanent: dead-lettered at once, with the saga and instance in the
// message.
//
// # Ordering
//
// A saga is one subscriber partition (Options.Partitions > 1 is refused:
// one instance's events may come from several streams, and partitions split
// the log by stream). It reads the log in order, which is commit order and
// stream-version order within each stream, and a failing event is retried
// in place (the saga waits) by the RetryPolicy. So an instance handles its
// events in log order, even when they come from several streams, as long as
// none of them is dead-lettered.
//
// A dead letter breaks that order for an instance whose events come from
// several streams, under the default dead-letter policy (ParkStream: it
// holds back the rest of the dead letter's stream, not the instance) and
// under SkipEvent: the instance's later events from other streams are
// handled, and the dead-lettered event, when an operator retries it, after
// them. Within one stream the order always holds (ParkStream parks the
// stream's later events behind the dead letter). Where an instance must see
// its events strictly in log order, register the saga with
// Options.OnDeadLetter = projection.Stop: the saga then halts at a dead
// letter, every instance waiting, until it is retried (handled first) or
// skipped (TestInstanceOrderAcrossStreamsAfterADeadLetter).
//
// # Effects and the log's ordering lock
//
// An effect appended in the batch transaction takes the log's ordering lock
// (see eventstore.Store.AppendTx), held until the transaction commits: every
// other append in the database waits meanwhile. So the saga asks the runner
// (projection.CommitCutter) to commit right after each event whose handler
// appended: the lock is held for the rest of that event's work (its state
// update, the checkpoint and the COMMIT), not for the rest of the batch.
// Events that append nothing share transactions, up to BatchSize
// (DefaultBatchSize). Append late in a handler, after its reads.
//
// # Commanding aggregates
//
// A handler that must change an aggregate goes through the aggregate's
// repository, so its business rules apply, rather than appending raw
// events with eventstore.Any to a stream name it builds by hand:
//
//	_, err := saga.Update(ctx, inst, orders, inst.State.OrderID, func(o *Order) error {
//		return o.Cancel("payment overdue") // the aggregate's rules decide
//	})
//	if errors.Is(err, ErrAlreadyPaid) { ... } // refused: nothing saved
//
// Update and Create load the aggregate in the instance's transaction
// (aggregate.Repository.LoadTx), run the command and append its events there
// with the loaded version as the expected version (SaveTx), stamped with
// the causation and correlation of Append. They commit with the instance's
// state and the checkpoint: exactly once, through crashes and leader kills
// (saga/TestExactlyOnceThroughLeaderKills has its saga command a Tally
// aggregate that refuses an addition out of sequence). A command's refusal
// leaves the transaction usable; a conflict (another writer saved the
// aggregate meanwhile) is returned from Handle, and the runner retries the
// event, which then loads the newer aggregate. Like Append, they take the
// log's ordering lock, so the runner commits right after the event.
// Deadlines are the same: a timer's event reaches the saga like any other,
// and its handler calls Update (saga/TestSagaCommandsAggregates).
//
// # Retention
//
// Completed instances are kept forever by default (they are what makes a
// late or duplicate event harmless). With Config.Retention, the saga's
// leader deletes completed rows older than that while it processes events,
// at most once per PruneInterval and 1000 rows at a time; an event that
// correlates to a pruned instance starts a new one.
package saga
