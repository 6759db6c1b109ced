package testkit_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/testkit"
)

// A replay whose sessions default to REPEATABLE READ (PGOPTIONS) runs the
// handler's setup: testkit begins the setup transaction READ COMMITTED, as
// projection.EnsureSetup requires (it refuses another isolation, under
// which a process waiting for another's setup would run it again). Not
// parallel: it sets PGOPTIONS for the replay's pool.
func TestReplayProjectionSetupUnderRepeatableReadDefault(t *testing.T) {
	// The harness's server and admin pool first, without PGOPTIONS.
	annalstest.NewDB(t, nil)
	t.Setenv("PGOPTIONS", `-c default_transaction_isolation=repeatable\ read`)
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[accDeposited](reg, "acc.deposited")
	setups := 0
	p := projection.New("rr.totals", reg)
	p.OnSetup(1, func(ctx context.Context, tx pgx.Tx) error {
		setups++
		_, err := tx.Exec(ctx, `CREATE TABLE rr_totals (stream text PRIMARY KEY, amount int NOT NULL)`)
		return err
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[accDeposited]) error {
		_, err := tx.Exec(ctx, `INSERT INTO rr_totals VALUES ($1, $2)
			ON CONFLICT (stream) DO UPDATE SET amount = rr_totals.amount + $2`, e.StreamID, e.Data.Amount)
		return err
	})
	r := testkit.ReplayProjection(t, p, nil, accDeposited{Amount: 5}, accDeposited{Amount: 7})
	var iso string
	if err := r.Pool.QueryRow(t.Context(), `SHOW default_transaction_isolation`).Scan(&iso); err != nil || iso != "repeatable read" {
		t.Fatalf("the replay's default_transaction_isolation = %q, %v; want repeatable read", iso, err)
	}
	var amount int
	if err := r.Pool.QueryRow(t.Context(), `SELECT amount FROM rr_totals`).Scan(&amount); err != nil || amount != 12 || setups != 1 {
		t.Fatalf("rr_totals amount = %d, %v, %d setups; want 12, 1 setup", amount, err, setups)
	}
}
