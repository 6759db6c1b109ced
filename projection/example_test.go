package projection_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// The events of the example: plain Go structs, encoded as JSON.
type AccountOpened struct {
	Owner string `json:"owner"`
}

type MoneyDeposited struct {
	Amount int `json:"amount"`
}

type MoneyWithdrawn struct {
	Amount int `json:"amount"`
}

// A typed projection that keeps account balances in a table of the same
// database, registered on a Runner and brought up to the head of the log.
func ExampleRunner_RunUntilCaughtUp() {
	ctx := context.Background()
	pool, done := exampleDB() // in your code: pgxpool.New(ctx, os.Getenv("DATABASE_URL")), migrations.Up
	defer done()

	reg := eventstore.NewRegistry()
	eventstore.MustRegister[AccountOpened](reg, "account.opened")
	eventstore.MustRegister[MoneyDeposited](reg, "account.deposited")
	eventstore.MustRegister[MoneyWithdrawn](reg, "account.withdrawn")
	store, err := eventstore.New(pool, &eventstore.Config{Registry: reg})
	if err != nil {
		fmt.Println(err)
		return
	}

	// The read model. Its writes run in the transaction that also moves the
	// projection's checkpoint, so each event is applied exactly once.
	if _, err := pool.Exec(ctx, `CREATE TABLE balances (
		account text PRIMARY KEY, owner text NOT NULL, amount int NOT NULL DEFAULT 0)`); err != nil {
		fmt.Println(err)
		return
	}
	p := projection.New("balances", reg)
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[AccountOpened]) error {
		_, err := tx.Exec(ctx, `INSERT INTO balances (account, owner) VALUES ($1, $2)`, e.StreamID, e.Data.Owner)
		return err
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[MoneyDeposited]) error {
		_, err := tx.Exec(ctx, `UPDATE balances SET amount = amount + $2 WHERE account = $1`, e.StreamID, e.Data.Amount)
		return err
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[MoneyWithdrawn]) error {
		_, err := tx.Exec(ctx, `UPDATE balances SET amount = amount - $2 WHERE account = $1`, e.StreamID, e.Data.Amount)
		return err
	})

	runner, err := projection.NewRunner(pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	// Register reports mistakes in the typed handlers (an unregistered
	// event type, two handlers for one type) as well as bad options.
	if err := runner.Register(p, nil); err != nil {
		fmt.Println(err)
		return
	}

	appendOrPrint := func(stream string, expected eventstore.ExpectedVersion, events ...any) {
		data := make([]eventstore.EventData, len(events))
		for i, e := range events {
			data[i] = eventstore.NewEvent(e)
		}
		if _, err := store.Append(ctx, stream, expected, data...); err != nil {
			fmt.Println(err)
		}
	}
	printBalances := func() {
		rows, _ := pool.Query(ctx, `SELECT account, owner, amount FROM balances ORDER BY account`)
		var account, owner string
		var amount int
		_, err := pgx.ForEachRow(rows, []any{&account, &owner, &amount}, func() error {
			fmt.Printf("  %s (%s): %d\n", account, owner, amount)
			return nil
		})
		if err != nil {
			fmt.Println(err)
		}
		var position int64
		err = pool.QueryRow(ctx, `SELECT position FROM annals.checkpoints WHERE subscriber_id = 'balances'`).Scan(&position)
		if err != nil {
			fmt.Println(err)
		}
		fmt.Println("  checkpoint:", position)
	}

	appendOrPrint("account-alice", eventstore.NoStream, AccountOpened{Owner: "Alice"}, MoneyDeposited{Amount: 100})
	appendOrPrint("account-bob", eventstore.NoStream, AccountOpened{Owner: "Bob"})
	appendOrPrint("account-alice", eventstore.Exact(2), MoneyWithdrawn{Amount: 30})

	// RunUntilCaughtUp processes every registered subscriber up to the head
	// of the log as it is now, then returns (tests, rebuilds, batch jobs).
	// A service runs runner.Run(ctx) instead: it follows the log live until
	// ctx ends.
	if err := runner.RunUntilCaughtUp(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("after the first run:")
	printBalances()

	// The next run resumes after the checkpoint: only the new event is applied.
	appendOrPrint("account-bob", eventstore.Exact(1), MoneyDeposited{Amount: 25})
	if err := runner.RunUntilCaughtUp(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("after the second run:")
	printBalances()

	// Output:
	// after the first run:
	//   account-alice (Alice): 70
	//   account-bob (Bob): 0
	//   checkpoint: 4
	// after the second run:
	//   account-alice (Alice): 70
	//   account-bob (Bob): 25
	//   checkpoint: 5
}

// exampleDB returns a pool on a new database with the annals schema, and a
// function that closes it and drops the database. An example without a
// database must fail, not pass unseen, so it panics when there is none.
func exampleDB() (*pgxpool.Pool, func()) {
	db, closeDB, err := annalstest.Open(context.Background(), nil)
	if err != nil {
		panic(fmt.Sprintf("example database: %v", err))
	}
	return db.Pool, func() { _ = closeDB() }
}
