package eventstore_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// The events of the examples: plain Go structs, encoded as JSON.
type AccountOpened struct {
	Owner string `json:"owner"`
}

type MoneyDeposited struct {
	Amount int `json:"amount"`
}

type MoneyWithdrawn struct {
	Amount int `json:"amount"`
}

// Append with an expected version, and handle a writer whose version is stale.
func ExampleStore_Append() {
	ctx := context.Background()
	pool, done := exampleDB() // in your code: pgxpool.New(ctx, os.Getenv("DATABASE_URL")), migrations.Up
	defer done()

	reg := eventstore.NewRegistry()
	eventstore.MustRegister[AccountOpened](reg, "account.opened")
	eventstore.MustRegister[MoneyDeposited](reg, "account.deposited")
	store, err := eventstore.New(pool, &eventstore.Config{Registry: reg})
	if err != nil {
		fmt.Println(err)
		return
	}

	// NoStream: the stream must not exist yet.
	res, err := store.Append(ctx, "account-alice", eventstore.NoStream,
		eventstore.NewEvent(AccountOpened{Owner: "Alice"}),
		eventstore.NewEvent(MoneyDeposited{Amount: 100}))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("opened: stream version %d, positions %d and %d\n",
		res.StreamVersion, res.Events[0].GlobalSequence, res.Events[1].GlobalSequence)

	// Exact(n): the stream must be at version n, the version this writer
	// based its decision on. Two writers that read version 2 race here...
	_, err = store.Append(ctx, "account-alice", eventstore.Exact(res.StreamVersion),
		eventstore.NewEvent(MoneyDeposited{Amount: 50}))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("first writer: appended")

	// ...and the second one is refused with the actual version; nothing of
	// its append is written. It must load the stream again, decide again,
	// and append with the new version.
	_, err = store.Append(ctx, "account-alice", eventstore.Exact(res.StreamVersion),
		eventstore.NewEvent(MoneyDeposited{Amount: 7}))
	var wev *eventstore.WrongExpectedVersionError
	if errors.As(err, &wev) {
		fmt.Printf("second writer: refused (expected %s, actual %d)\n", wev.Expected, wev.Actual)
	}
	fmt.Println("matches ErrWrongExpectedVersion:", errors.Is(err, eventstore.ErrWrongExpectedVersion))

	// NoStream on an existing stream is refused the same way.
	_, err = store.Append(ctx, "account-alice", eventstore.NoStream,
		eventstore.NewEvent(AccountOpened{Owner: "Mallory"}))
	fmt.Println(err)

	version, err := store.StreamVersion(ctx, "account-alice")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("stream version:", version)

	// Output:
	// opened: stream version 2, positions 1 and 2
	// first writer: appended
	// second writer: refused (expected 2, actual 3)
	// matches ErrWrongExpectedVersion: true
	// wrong expected version for stream "account-alice": expected no stream, actual 3
	// stream version: 3
}

// Read a stream in version order and decode each event into its Go type.
func ExampleStore_ReadStream() {
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
	_, err = store.Append(ctx, "account-bob", eventstore.NoStream,
		eventstore.NewEvent(AccountOpened{Owner: "Bob"}),
		eventstore.NewEvent(MoneyDeposited{Amount: 100}),
		eventstore.NewEvent(MoneyWithdrawn{Amount: 30}))
	if err != nil {
		fmt.Println(err)
		return
	}

	// ReadStream yields the events from a version (1: the beginning), a page
	// at a time. Registry.Decode returns the registered Go type as a value.
	balance := 0
	for e, err := range store.ReadStream(ctx, "account-bob", 1) {
		if err != nil {
			fmt.Println(err)
			return
		}
		v, err := reg.Decode(e)
		if err != nil {
			fmt.Println(err)
			return
		}
		switch ev := v.(type) {
		case AccountOpened:
			fmt.Printf("v%d %s: owner %s\n", e.StreamVersion, e.Type, ev.Owner)
		case MoneyDeposited:
			balance += ev.Amount
			fmt.Printf("v%d %s: +%d\n", e.StreamVersion, e.Type, ev.Amount)
		case MoneyWithdrawn:
			balance -= ev.Amount
			fmt.Printf("v%d %s: -%d\n", e.StreamVersion, e.Type, ev.Amount)
		}
	}
	fmt.Println("balance:", balance)

	// When the type is known, Decode[T] returns an Envelope[T]: the stored
	// event with its payload decoded into T.
	for e, err := range store.ReadStream(ctx, "account-bob", 3) {
		if err != nil {
			fmt.Println(err)
			return
		}
		w, err := eventstore.Decode[MoneyWithdrawn](reg, e)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("from version 3: %s v%d withdrew %d\n", w.StreamID, w.StreamVersion, w.Data.Amount)
	}

	// A stream with no events is an error, not an empty loop.
	for _, err := range store.ReadStream(ctx, "account-nobody", 1) {
		fmt.Println("missing stream:", errors.Is(err, eventstore.ErrStreamNotFound))
	}

	// Output:
	// v1 account.opened: owner Bob
	// v2 account.deposited: +100
	// v3 account.withdrawn: -30
	// balance: 70
	// from version 3: account-bob v3 withdrew 30
	// missing stream: true
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
