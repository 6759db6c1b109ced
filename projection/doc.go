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
//     and take over within seconds when the leader dies.
//   - Projections: each batch of events and the checkpoint commit in one
//     transaction on the lock's connection, fenced by the leader's epoch. A
//     read-model write is applied exactly once; a leader that has lost its
//     lock cannot commit.
//   - Observers: at-least-once; Handle gets the event (use e.ID to make side
//     effects idempotent). Checkpoints are written every CheckpointEvery
//     events or CheckpointInterval (also while idle), so a crash re-delivers
//     at most that many events; a graceful shutdown re-delivers none.
//   - Every subscriber sees each stream's events in stream-version order,
//     with partitions too.
//   - Failures are recorded, never lost: each failed attempt (an error, a
//     panic with its stack, a HandlerTimeout) is a row in failures, retried
//     by the subscriber's RetryPolicy (3 retries, 1 s ×2 up to 60 s by
//     default; annals.Permanent errors are not retried). When the policy is
//     spent the event becomes a dead letter, committed with the checkpoint
//     move, and the DeadLetterPolicy applies: ParkStream (projections'
//     default) holds back the rest of the stream in order, SkipEvent
//     (observers' default) moves on, Stop halts the partition. Operators act
//     with package deadletter or annals dlq; released entries are
//     re-delivered by the live leader, in order.
//   - Telemetry: a span per handler call, linked to the append that produced
//     the event, and the metrics listed in internal/telemetry.
//
// The algorithm, with its state machine, is described in package catchup.
package projection
