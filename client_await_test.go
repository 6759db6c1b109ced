package annals_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/aggregate"
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

// rwAccount is an aggregate for read-your-writes through a repository.
type rwAccount struct {
	aggregate.Base
	Balance int
}

func (a *rwAccount) Apply(event any) error {
	switch e := event.(type) {
	case clDeposited:
		a.Balance += e.Amount
	default:
		return aggregate.ErrUnhandledEvent
	}
	return nil
}

func (a *rwAccount) Deposit(n int) error { return aggregate.Record(a, clDeposited{Amount: n}) }

// A service that saves an aggregate through a repository reads its own
// write: the aggregate's SavedPosition is the position of the event the save
// appended, and Client.Await on it returns once a partitioned projection
// has applied that event.
func TestClientAwaitAfterRepositorySave(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[clDeposited](reg, "cl.deposited")
	// A one-minute poll: only the checkpoints' notifications move Await.
	c, err := annals.New(db.Pool, &annals.Config{Registry: reg, Runner: &projection.Config{PollInterval: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	p := projection.New("rs.balances", reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE rs_balances (account text PRIMARY KEY, amount bigint NOT NULL)`))
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[clDeposited]) error {
		_, err := tx.Exec(ctx, `INSERT INTO rs_balances VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET amount = rs_balances.amount + $2`, e.StreamID, e.Data.Amount)
		return err
	})
	if err := annals.AddProjection(c, p, &projection.Options{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	repo, err := annals.NewRepository(c, "acct", func() *rwAccount { return &rwAccount{} }, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })

	amount := func(account string) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT amount FROM rs_balances WHERE account = $1), 0)`, repo.StreamID(account)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// stored returns the position of the stream's last event.
	stored := func(account string) int64 {
		t.Helper()
		var last int64
		for e, err := range c.ReadStream(ctx, repo.StreamID(account), 1) {
			if err != nil {
				t.Fatal(err)
			}
			last = e.GlobalSequence
		}
		return last
	}
	await := func(what string, pos int64) {
		t.Helper()
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := c.Await(actx, "rs.balances", pos); err != nil {
			t.Fatalf("%s: Await(%d): %v", what, pos, err)
		}
	}

	var last int64
	for i := range 5 {
		id := fmt.Sprint(i)
		a, err := repo.Create(ctx, id, func(a *rwAccount) error { return a.Deposit(1) })
		if err != nil {
			t.Fatal(err)
		}
		if pos := a.SavedPosition(); pos != stored(id) || pos <= last {
			t.Fatalf("Create %s: SavedPosition %d, want %d (the stored event's), after %d", id, pos, stored(id), last)
		}
		last = a.SavedPosition()
	}
	for i := range 12 {
		id := fmt.Sprint(i % 5)
		a, err := repo.Update(ctx, id, func(a *rwAccount) error { return a.Deposit(i + 1) })
		if err != nil {
			t.Fatal(err)
		}
		pos := a.SavedPosition()
		if pos != stored(id) || pos <= last {
			t.Fatalf("Update %d: SavedPosition %d, want %d (the stored event's), after %d", i, pos, stored(id), last)
		}
		last = pos
		await(fmt.Sprintf("Update %d", i), pos)
		if got := amount(id); got != a.Balance {
			t.Fatalf("after Await of update %d the read model shows %d for %s, want %d", i, got, id, a.Balance)
		}
	}

	// SaveTx: the position the events have once the transaction commits.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a, err := repo.UpdateTx(ctx, tx, "3", func(a *rwAccount) error { return a.Deposit(100) })
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if pos := a.SavedPosition(); pos != stored("3") || pos <= last {
		t.Fatalf("UpdateTx: SavedPosition %d, want %d (the stored event's), after %d", pos, stored("3"), last)
	}
	await("UpdateTx", a.SavedPosition())
	if got := amount("3"); got != a.Balance {
		t.Fatalf("after Await of UpdateTx the read model shows %d, want %d", got, a.Balance)
	}

	// Nothing appended, nothing to wait for: a loaded aggregate, and an
	// Update whose command records nothing, are at position 0.
	if a, err := repo.Load(ctx, "1"); err != nil || a.SavedPosition() != 0 {
		t.Fatalf("Load: SavedPosition %d, %v; want 0", a.SavedPosition(), err)
	}
	if a, err := repo.Update(ctx, "1", func(*rwAccount) error { return nil }); err != nil || a.SavedPosition() != 0 {
		t.Fatalf("Update that records nothing: SavedPosition %d, %v; want 0", a.SavedPosition(), err)
	}
}
