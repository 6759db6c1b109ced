package annals_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// TestReadmeRebuild: the README's "Rebuilding a projection" calls
// client.Rebuild on the README example's projection, so that projection
// must reset (the new-user trial found it had OnSetup only, and Rebuild
// failed with "has no OnReset"). Its lines are the README's and Example's.
func TestReadmeRebuild(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"p := projection.New(\"balances\", reg)",
		"p.OnSetup(1, projection.Statements(`CREATE TABLE balances (account text PRIMARY KEY, amount bigint)`))",
		"p.OnReset(projection.Statements(`TRUNCATE balances`)) // a rebuild clears it, then replays",
		"err := client.Rebuild(ctx, \"balances\", &projection.RebuildOptions{OnProgress: report})",
	} {
		if !strings.Contains(string(readme), line) {
			t.Fatalf("README.md lacks the line this test runs: %s", line)
		}
	}

	ctx := t.Context()
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[MoneyDeposited](reg, "account.deposited")
	client, err := annals.New(annalstest.NewDB(t, nil).Pool, &annals.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	p := projection.New("balances", reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE balances (account text PRIMARY KEY, amount bigint)`))
	p.OnReset(projection.Statements(`TRUNCATE balances`)) // a rebuild clears it, then replays
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[MoneyDeposited]) error {
		_, err := tx.Exec(ctx, `INSERT INTO balances VALUES ($1, $2)
		ON CONFLICT (account) DO UPDATE SET amount = balances.amount + $2`, e.StreamID, e.Data.Amount)
		return err
	})
	if err := annals.AddProjection(client, p, nil); err != nil {
		t.Fatal(err)
	}
	if err := client.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, amount := range []int{100, 20} {
		if _, err := client.Append(ctx, "account-alice", eventstore.Any, eventstore.NewEvent(MoneyDeposited{Amount: amount})); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Pool().Exec(ctx, `UPDATE balances SET amount = -1`); err != nil {
		t.Fatal(err)
	}
	var progressed bool
	report := func(projection.RebuildProgress) { progressed = true }
	if err := client.Rebuild(ctx, "balances", &projection.RebuildOptions{OnProgress: report}); err != nil {
		t.Fatal(err)
	}
	var amount int64
	if err := client.Pool().QueryRow(ctx, `SELECT amount FROM balances WHERE account = 'account-alice'`).Scan(&amount); err != nil {
		t.Fatal(err)
	}
	if amount != 120 || !progressed {
		t.Fatalf("after the rebuild: amount %d (want 120), progress reported %v", amount, progressed)
	}
}
