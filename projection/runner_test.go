package projection_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

type Deposited struct {
	Amount int `json:"amount"`
}

type Withdrawn struct {
	Amount int `json:"amount"`
}

type bundle struct {
	db    *annalstest.DB
	store *eventstore.Store
	reg   *eventstore.Registry
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return setupOn(t, annalstest.NewDB(t, nil))
}

// setupOn is setup on a migrated database of the caller's.
func setupOn(t *testing.T, db *annalstest.DB) *bundle {
	t.Helper()
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Deposited](reg, "account.deposited")
	eventstore.MustRegister[Withdrawn](reg, "account.withdrawn")
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(context.Background(), `CREATE TABLE balances (account text PRIMARY KEY, amount bigint NOT NULL, events int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &bundle{db: db, store: store, reg: reg}
}

// balances is a transactional projection: balance and event count per stream.
func balances(reg *eventstore.Registry) *projection.Typed {
	p := projection.New("balances", reg)
	apply := func(ctx context.Context, tx pgx.Tx, account string, delta int) error {
		_, err := tx.Exec(ctx, `INSERT INTO balances VALUES ($1, $2, 1)
			ON CONFLICT (account) DO UPDATE SET amount = balances.amount + $2, events = balances.events + 1`, account, delta)
		return err
	}
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Deposited]) error {
		return apply(ctx, tx, e.StreamID, e.Data.Amount)
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Withdrawn]) error {
		return apply(ctx, tx, e.StreamID, -e.Data.Amount)
	})
	return p
}

func appendN(t *testing.T, b *bundle, n int, streams int) map[string]int64 {
	t.Helper()
	want := map[string]int64{}
	for i := range n {
		s := fmt.Sprintf("acct-%d", i%streams)
		var ev eventstore.EventData
		if i%3 == 2 {
			ev = eventstore.NewEvent(Withdrawn{Amount: i})
			want[s] -= int64(i)
		} else {
			ev = eventstore.NewEvent(Deposited{Amount: i})
			want[s] += int64(i)
		}
		if _, err := b.store.Append(context.Background(), s, eventstore.Any, ev); err != nil {
			t.Fatal(err)
		}
	}
	return want
}

func readBalances(t *testing.T, b *bundle) map[string]int64 {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT account, amount FROM balances`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	var a string
	var v int64
	if _, err := pgx.ForEachRow(rows, []any{&a, &v}, func() error { got[a] = v; return nil }); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestRunUntilCaughtUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := appendN(t, b, 1200, 7)
	r, err := projection.NewRunner(b.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(balances(b.reg), &projection.Options{BatchSize: 100}); err != nil {
		t.Fatal(err)
	}
	if err := r.RunUntilCaughtUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := readBalances(t, b); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("balances %v, want %v", got, want)
	}
	// Again: nothing new, nothing applied twice.
	if err := r.RunUntilCaughtUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := readBalances(t, b); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("second run changed balances: %v", got)
	}
}

func TestRunLive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := appendN(t, b, 300, 5)
	r, err := projection.NewRunner(b.db.Pool, &projection.Config{PollInterval: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(balances(b.reg), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	var runErr error
	go func() { defer wg.Done(); runErr = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	more := appendN(t, b, 300, 5) // while it catches up and then live
	for k, v := range more {
		want[k] += v
	}
	// The poll interval is 5 s: delivery within it proves the NOTIFY path.
	annalstest.WaitFor(t, 4*time.Second, func() bool { return fmt.Sprint(readBalances(t, b)) == fmt.Sprint(want) })
	cancel()
	wg.Wait()
	if runErr != nil {
		t.Fatal(runErr)
	}
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM annals.instances`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("instance not deregistered: %d, %v", n, err)
	}
}
