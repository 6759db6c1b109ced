package annals_test

import (
	"context"
	"log"
	"os"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

type MoneyDeposited struct {
	Amount int `json:"amount"`
}

// The README's first example, kept here so that it compiles (it needs a
// database, so it has no Output; TestClient runs the same path).
func Example() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[MoneyDeposited](reg, "account.deposited")
	client, _ := annals.New(pool, &annals.Config{Registry: reg})

	p := projection.New("balances", reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE balances (account text PRIMARY KEY, amount bigint)`))
	p.OnReset(projection.Statements(`TRUNCATE balances`)) // a rebuild clears it, then replays
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[MoneyDeposited]) error {
		_, err := tx.Exec(ctx, `INSERT INTO balances VALUES ($1, $2)
		ON CONFLICT (account) DO UPDATE SET amount = balances.amount + $2`, e.StreamID, e.Data.Amount)
		return err // retried by policy, then dead-lettered: annals dlq list
	})
	_ = annals.AddProjection(client, p, nil)

	_ = client.Start(ctx) // migrate, create the table (once), catch up, follow the log live
	defer client.Stop(ctx)

	// Optimistic concurrency: fails with the actual version if someone else appended.
	_, err := client.Append(ctx, "account-alice", eventstore.Exact(2), eventstore.NewEvent(MoneyDeposited{Amount: 100}))
	var wev *eventstore.WrongExpectedVersionError
	if errors.As(err, &wev) {
		log.Printf("stream is at version %d", wev.Actual)
	}
}
