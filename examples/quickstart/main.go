package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
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

// balances is the read model: one row per account, kept by a projection
// in the transaction that moves its checkpoint (exactly once).
func balances(reg *eventstore.Registry) *projection.Typed {
	p := projection.New("quickstart.balances", reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE IF NOT EXISTS quickstart_balances (
		account text PRIMARY KEY, amount bigint NOT NULL)`))
	add := func(ctx context.Context, tx pgx.Tx, account string, amount int) error {
		_, err := tx.Exec(ctx, `INSERT INTO quickstart_balances VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET amount = quickstart_balances.amount + $2`, account, amount)
		return err
	}
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[MoneyDeposited]) error {
		return add(ctx, tx, e.StreamID, e.Data.Amount)
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[MoneyWithdrawn]) error {
		return add(ctx, tx, e.StreamID, -e.Data.Amount)
	})
	return p
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

	// 1. Name the event types once; one client holds store, runner and scheduler.
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[AccountOpened](reg, "account.opened")
	eventstore.MustRegister[MoneyDeposited](reg, "account.deposited")
	eventstore.MustRegister[MoneyWithdrawn](reg, "account.withdrawn")
	client, err := annals.New(pool, &annals.Config{Registry: reg})
	if err != nil {
		return err
	}
	if err := annals.AddProjection(client, balances(reg), nil); err != nil {
		return err
	}
	// 2. Start: migrate the schema, create the read model (OnSetup), follow the log.
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()

	// 3. Append to two streams. The expected version makes concurrent
	//    writers to one stream safe.
	suffix := runID()
	alice, bob := "account-alice-"+suffix, "account-bob-"+suffix
	fmt.Printf("quickstart: two accounts, a transfer, a projection (run %s)\n\n", suffix)
	if _, err := client.Append(ctx, alice, eventstore.NoStream,
		eventstore.NewEvent(AccountOpened{Owner: "Alice"}),
		eventstore.NewEvent(MoneyDeposited{Amount: 100})); err != nil {
		return err
	}
	if _, err := client.Append(ctx, bob, eventstore.NoStream,
		eventstore.NewEvent(AccountOpened{Owner: "Bob"})); err != nil {
		return err
	}
	// A transfer touches both streams: one transaction, appended last.
	if _, err := client.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		if err := b.Append(alice, eventstore.Exact(2), eventstore.NewEvent(MoneyWithdrawn{Amount: 30})); err != nil {
			return err
		}
		return b.Append(bob, eventstore.Exact(1), eventstore.NewEvent(MoneyDeposited{Amount: 30}))
	}); err != nil {
		return err
	}

	// 4. A writer that read alice at version 1 appends: refused, with the
	//    actual version, and nothing is written.
	_, err = client.Append(ctx, alice, eventstore.Exact(1), eventstore.NewEvent(MoneyDeposited{Amount: 1}))
	var wev *eventstore.WrongExpectedVersionError
	if !errors.As(err, &wev) {
		return errors.Newf("a stale expected version was not refused: %v", err)
	}
	fmt.Printf("optimistic concurrency: an append to %s expecting version %s was refused: it is at %d\n\n",
		wev.StreamID, wev.Expected, wev.Actual)

	// 5. The log, in commit order (this run's streams).
	fmt.Println("the log, in commit order:")
	var last int64
	for e, err := range client.ReadAll(ctx, 0) {
		if err != nil {
			return err
		}
		if e.StreamID == alice || e.StreamID == bob {
			fmt.Printf("  #%d  %-24s v%d  %-18s %s\n", e.GlobalSequence, e.StreamID, e.StreamVersion, e.Type, e.Data)
			last = e.GlobalSequence
		}
	}

	// 6. The read model, once the projection has passed the last event.
	//    Client.Await is read-your-writes: it returns once the projection's
	//    checkpoint has passed the position (woken by a notification).
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := client.Await(actx, "quickstart.balances", last); err != nil {
		return err
	}
	fmt.Println("\nthe quickstart_balances read model (kept by the projection, live):")
	for _, acct := range []string{alice, bob} {
		var amount int
		if err := pool.QueryRow(ctx, `SELECT amount FROM quickstart_balances WHERE account = $1`, acct).Scan(&amount); err != nil {
			return err
		}
		fmt.Printf("  %-24s %4d\n", acct, amount)
	}
	return nil
}

func runID() string {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
