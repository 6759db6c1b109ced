package annals_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// TestClientReadYourWrites covers the two ways the client keeps a writer's
// read model current: an inline projection (Config.Inline) is written in
// the append's own transaction, and Client.Await waits for an async
// projection to pass an append's position, or says how far behind it is.
func TestClientReadYourWrites(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE rw_inline (account text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[clDeposited](reg, "cl.deposited")

	upsert := func(table string) func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[clDeposited]) error {
		return func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[clDeposited]) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, $2)
				ON CONFLICT (account) DO UPDATE SET amount = `+table+`.amount + $2`, e.StreamID, e.Data.Amount)
			return err
		}
	}
	inline := projection.New("rw.inline", reg)
	projection.On(inline, upsert("rw_inline"))

	c, err := annals.New(db.Pool, &annals.Config{Registry: reg, Inline: []eventstore.InlineProjection{inline},
		Runner: &projection.Config{PollInterval: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	async := projection.New("rw.async", reg)
	async.OnSetup(1, projection.Statements(`CREATE TABLE rw_async (account text PRIMARY KEY, amount bigint NOT NULL)`))
	projection.On(async, upsert("rw_async"))
	if err := annals.AddProjection(c, async, nil); err != nil {
		t.Fatal(err)
	}

	amount := func(table, account string) int64 {
		t.Helper()
		var n int64
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT amount FROM `+table+` WHERE account = $1), 0)`, account).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Not started: the inline read model is current anyway; Await times out
	// with a BehindError naming the target.
	res, err := c.Append(ctx, "acct-1", eventstore.NoStream, eventstore.NewEvent(clDeposited{Amount: 5}))
	if err != nil {
		t.Fatal(err)
	}
	if got := amount("rw_inline", "acct-1"); got != 5 {
		t.Fatalf("inline read model right after the append: %d, want 5", got)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = c.Await(short, "rw.async", res.Position())
	cancel()
	var behind *projection.BehindError
	if !errors.As(err, &behind) || behind.Target != res.Position() {
		t.Fatalf("Await on a projection nobody runs: %v, want a BehindError for position %d", err, res.Position())
	}
	if err := c.Await(ctx, "rw.nobody", res.Position()); err == nil {
		t.Fatal("Await of an unregistered name succeeded")
	}

	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	// Running, with a one-minute poll: only notifications move things along.
	for i := range 20 {
		res, err := c.Append(ctx, "acct-2", eventstore.Exact(int64(i)), eventstore.NewEvent(clDeposited{Amount: 1}))
		if err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = c.Await(actx, "rw.async", res.Position())
		cancel()
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		if got, want := amount("rw_async", "acct-2"), int64(i+1); got != want {
			t.Fatalf("after Await of append %d the async read model shows %d, want %d", i, got, want)
		}
		if got, want := amount("rw_inline", "acct-2"), int64(i+1); got != want {
			t.Fatalf("after append %d the inline read model shows %d, want %d", i, got, want)
		}
	}
}
