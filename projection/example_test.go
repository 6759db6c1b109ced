package projection_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/migrations"
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
// function that closes the pool and drops the database.
//
// Examples cannot use annalstest.NewDB, which needs a testing.TB, so they
// make their database themselves on the server the test harness would use:
// the admin URL in ANNALS_TEST_DATABASE_URL (which `make test` always sets),
// or else a throwaway cluster started from the local PostgreSQL server
// binaries, which the returned function stops. If neither works it panics:
// an example without a database must fail, not pass unseen.
func exampleDB() (*pgxpool.Pool, func()) {
	ctx := context.Background()
	var undo []func()
	done := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	fail := func(err error) {
		done()
		panic(fmt.Sprintf("example database: %v (set %s or install the PostgreSQL server)", err, annalstest.EnvDatabaseURL))
	}

	adminURL := os.Getenv(annalstest.EnvDatabaseURL)
	if adminURL == "" {
		cluster, err := pgcluster.Start(ctx, nil)
		if err != nil {
			fail(err)
		}
		undo = append(undo, func() { _ = cluster.Stop(context.Background()) })
		adminURL = cluster.URL()
	}
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		fail(err)
	}
	undo = append(undo, func() { _ = admin.Close(context.Background()) })

	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "annals_example_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0"); err != nil {
		fail(err)
	}
	undo = append(undo, func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})

	cfg, err := pgxpool.ParseConfig(adminURL)
	if err != nil {
		fail(err)
	}
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fail(err)
	}
	undo = append(undo, pool.Close)
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		fail(err)
	}
	return pool, done
}
