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
//   - A handler error (or panic) retries the event after RetryBackoff; the
//     runner never skips past it.
//
// The algorithm, with its state machine, is described in package catchup.
package projection
