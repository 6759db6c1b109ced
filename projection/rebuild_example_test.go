package projection_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// Rebuilding a typed projection: OnReset clears its read model in the
// transaction that sets its checkpoint back to 0, then every event is
// replayed. Live instances of the service stand by meanwhile and take over
// afterwards.
func ExampleRunner_Rebuild() {
	ctx := context.Background()
	pool, done := exampleDB()
	defer done()

	reg := eventstore.NewRegistry()
	eventstore.MustRegister[MoneyDeposited](reg, "account.deposited")
	store, err := eventstore.New(pool, &eventstore.Config{Registry: reg})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE totals (account text PRIMARY KEY, amount int NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}
	p := projection.New("totals", reg)
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[MoneyDeposited]) error {
		_, err := tx.Exec(ctx, `INSERT INTO totals VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET amount = totals.amount + $2`, e.StreamID, e.Data.Amount)
		return err
	})
	p.OnReset(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `TRUNCATE totals`)
		return err
	})
	runner, err := projection.NewRunner(pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := runner.Register(p, nil); err != nil {
		fmt.Println(err)
		return
	}
	for _, amount := range []int{10, 20, 12} {
		if _, err := store.Append(ctx, "acct-1", eventstore.Any, eventstore.NewEvent(MoneyDeposited{Amount: amount})); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := runner.RunUntilCaughtUp(ctx); err != nil {
		fmt.Println(err)
		return
	}
	// The read model went wrong (a bug since fixed, say): rebuild it.
	if _, err := pool.Exec(ctx, `UPDATE totals SET amount = -1`); err != nil {
		fmt.Println(err)
		return
	}
	err = runner.Rebuild(ctx, "totals", &projection.RebuildOptions{
		OnProgress: func(p projection.RebuildProgress) {
			if p.Finished {
				fmt.Printf("replayed %d of %d events\n", p.Done, p.Total)
			}
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	var amount int
	if err := pool.QueryRow(ctx, `SELECT amount FROM totals WHERE account = 'acct-1'`).Scan(&amount); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("acct-1:", amount)
	// Output:
	// replayed 3 of 3 events
	// acct-1: 42
}
