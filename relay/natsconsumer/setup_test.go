package natsconsumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/natsserver"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/relay"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// Deposited is the event of the setup tests.
type Deposited struct{ Amount int }

// relayedSetup makes a source database with n deposits relayed to an
// embedded NATS server, and returns a function making a Consumer of a
// durable on the relay's stream.
func relayedSetup(t *testing.T, ctx context.Context, n int) (func(durable string) *natsconsumer.Consumer, *eventstore.Registry) {
	t.Helper()
	src := annalstest.NewDB(t, nil)
	reg := eventstore.NewRegistry()
	if err := eventstore.Register[Deposited](reg, "deposited"); err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(src.Pool, &eventstore.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := store.Append(ctx, "acct-1", eventstore.Any, eventstore.NewEvent(Deposited{Amount: i + 1})); err != nil {
			t.Fatal(err)
		}
	}
	ns, err := natsserver.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	r, err := relay.New(src.Pool, nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	return func(durable string) *natsconsumer.Consumer {
		t.Helper()
		c, err := natsconsumer.New(ctx, nc, &natsconsumer.Config{Durable: durable, RetryBackoff: 20 * time.Millisecond,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}, reg
}

// copyProjection copies deposits into orders_copy, a table its setup
// (version v) creates; setups counts the setup's runs.
func copyProjection(reg *eventstore.Registry, v int, setups *int) *projection.Typed {
	p := projection.New("orders-copy", reg)
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Deposited]) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders_copy (pos, amount) VALUES ($1, $2) ON CONFLICT DO NOTHING`, e.GlobalSequence, e.Data.Amount)
		return err
	})
	p.OnSetup(v, func(ctx context.Context, tx pgx.Tx) error {
		*setups++
		return projection.Statements(`CREATE TABLE IF NOT EXISTS orders_copy (pos bigint PRIMARY KEY, amount int NOT NULL)`)(ctx, tx)
	})
	return p
}

// TestRunProjectionRunsTheSetup: RunProjection runs the projection's setup
// (OnSetup) in the destination database before it handles an event, once
// per version, recorded as a Runner records it. Before, it never ran it,
// and a projection writing to the table its setup makes failed on every
// event, retried twice a second for ever.
func TestRunProjectionRunsTheSetup(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dst := annalstest.NewDB(t, nil)
	consumer, reg := relayedSetup(t, ctx, 3)
	setups := 0
	// Each run is of a durable of its own, so that it handles the three
	// events (after its setup) whatever the runs before it did.
	runs := 0
	run := func(p *projection.Typed) {
		t.Helper()
		runs++
		durable := fmt.Sprintf("copy-%d", runs)
		c := consumer(durable)
		cctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.RunProjection(cctx, dst.Pool, p) }()
		annalstest.WaitFor(t, 20*time.Second, func() bool {
			var seq, n int
			_ = dst.Pool.QueryRow(ctx, `SELECT coalesce((SELECT stream_seq FROM annals.relay_checkpoints WHERE consumer = $1), 0),
				(SELECT count(*) FROM orders_copy)`, durable).Scan(&seq, &n)
			return seq == 3 && n == 3
		})
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	run(copyProjection(reg, 1, &setups))
	var v int
	if err := dst.Pool.QueryRow(ctx, `SELECT version FROM annals.read_model_setups WHERE projection = 'orders-copy'`).Scan(&v); err != nil || v != 1 {
		t.Fatalf("the setup's record: version %d, %v; want 1", v, err)
	}
	// Started again at the same version: not run again; a new version runs.
	run(copyProjection(reg, 1, &setups))
	if setups != 1 {
		t.Fatalf("the setup ran %d times at version 1; want once", setups)
	}
	run(copyProjection(reg, 2, &setups))
	if setups != 2 {
		t.Fatalf("the setup ran %d times after version 2; want twice", setups)
	}
}

// TestRunProjectionSetupOnAnUnmigratedSchema: the setup's record lives in
// the annals schema of the destination database (read_model_setups); when
// that is not migrated, RunProjection fails at once with
// migrations.ErrNotMigrated, saying to migrate, rather than with a raw
// "relation does not exist".
func TestRunProjectionSetupOnAnUnmigratedSchema(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dst := annalstest.NewDB(t, nil)
	consumer, reg := relayedSetup(t, ctx, 1)
	c := consumer("copy")
	if _, err := dst.Pool.Exec(ctx, `DROP TABLE annals.read_model_setups`); err != nil {
		t.Fatal(err)
	}
	setups := 0
	// Before, it retried the failed handler until its context ended.
	rctx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	err := c.RunProjection(rctx, dst.Pool, copyProjection(reg, 1, &setups))
	if !errors.Is(err, migrations.ErrNotMigrated) || !strings.Contains(err.Error(), "annals migrate") {
		t.Fatalf("RunProjection with a setup on a schema without read_model_setups: %v; want migrations.ErrNotMigrated, saying to run annals migrate", err)
	}
	if setups != 0 {
		t.Fatalf("the setup ran %d times", setups)
	}
}

// TestRunProjectionRefusesAMistakenProjection: a typed projection's
// mistakes (Typed.Err, here OnSetup with version 0) are reported, as
// Runner.Register reports them, instead of running the projection without
// its setup.
func TestRunProjectionRefusesAMistakenProjection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dst := annalstest.NewDB(t, nil)
	consumer, reg := relayedSetup(t, ctx, 1)
	c := consumer("copy")
	setups := 0
	rctx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	err := c.RunProjection(rctx, dst.Pool, copyProjection(reg, 0, &setups))
	if err == nil || !strings.Contains(err.Error(), "OnSetup(0") {
		t.Fatalf("RunProjection of a projection with OnSetup(0, ...): %v; want its mistake", err)
	}
}
