// Command quickstart appends a few events to two streams and reads them back.
//
//	DATABASE_URL=postgres://… go run ./examples/quickstart
//
// or, with a throwaway local PostgreSQL: make demo.
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
)

// The domain events, plain Go structs.
type AccountOpened struct {
	Owner string `json:"owner"`
}

type MoneyDeposited struct {
	Amount int `json:"amount"`
}

type MoneyWithdrawn struct {
	Amount int `json:"amount"`
}

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatalf("quickstart: %v", err)
	}
}

func run(ctx context.Context) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("set DATABASE_URL (or run `make demo`, which starts a throwaway PostgreSQL)")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()

	// 1. Create or upgrade the schema (idempotent, safe from many processes).
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		return err
	}

	// 2. Name the event types once.
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[AccountOpened](reg, "account.opened")
	eventstore.MustRegister[MoneyDeposited](reg, "account.deposited")
	eventstore.MustRegister[MoneyWithdrawn](reg, "account.withdrawn")
	store, err := eventstore.New(pool, &eventstore.Config{Registry: reg})
	if err != nil {
		return err
	}

	// 3. Append to two streams. The expected version makes concurrent
	//    writers to one stream safe.
	alice, bob := "account-alice", "account-bob"
	if _, err := store.Append(ctx, alice, eventstore.NoStream,
		eventstore.NewEvent(AccountOpened{Owner: "Alice"}),
		eventstore.NewEvent(MoneyDeposited{Amount: 100})); err != nil {
		return explain(err)
	}
	if _, err := store.Append(ctx, bob, eventstore.NoStream,
		eventstore.NewEvent(AccountOpened{Owner: "Bob"})); err != nil {
		return explain(err)
	}
	// A transfer touches both streams: one transaction, appended last.
	if _, err := store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		if err := b.Append(alice, eventstore.Exact(2), eventstore.NewEvent(MoneyWithdrawn{Amount: 30})); err != nil {
			return err
		}
		return b.Append(bob, eventstore.Exact(1), eventstore.NewEvent(MoneyDeposited{Amount: 30}))
	}); err != nil {
		return explain(err)
	}

	// 4. A stale expected version is refused with the actual version.
	_, err = store.Append(ctx, alice, eventstore.Exact(1), eventstore.NewEvent(MoneyDeposited{Amount: 1}))
	var wev *eventstore.WrongExpectedVersionError
	if errors.As(err, &wev) {
		fmt.Printf("refused: %s expected version %s, but it is at %d\n\n", wev.StreamID, wev.Expected, wev.Actual)
	}

	// 5. Read the whole log back, decoding each event into its Go type.
	fmt.Println("the log, in commit order:")
	balances := map[string]int{}
	for e, err := range store.ReadAll(ctx, 0) {
		if err != nil {
			return err
		}
		v, err := reg.Decode(e)
		if err != nil {
			return err
		}
		switch ev := v.(type) {
		case MoneyDeposited:
			balances[e.StreamID] += ev.Amount
		case MoneyWithdrawn:
			balances[e.StreamID] -= ev.Amount
		}
		fmt.Printf("  #%d  %-14s v%d  %-18s %s\n", e.GlobalSequence, e.StreamID, e.StreamVersion, e.Type, e.Data)
	}

	// 6. Or one stream, from a version.
	fmt.Println("\nbalances:")
	for _, s := range []string{alice, bob} {
		v, err := store.StreamVersion(ctx, s)
		if err != nil {
			return err
		}
		fmt.Printf("  %-14s %4d  (stream version %d)\n", s, balances[s], v)
	}
	return nil
}

func explain(err error) error {
	if errors.Is(err, eventstore.ErrWrongExpectedVersion) {
		return errors.Wrap(err, "the demo streams exist already in this database: run it against a fresh one (make demo does)")
	}
	return err
}
