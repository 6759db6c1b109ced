package aggregate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// A bank account: create it, run commands with Update, load it, and see the
// typed errors for a missing aggregate and a broken invariant.
func ExampleRepository() {
	ctx := context.Background()
	db, closeDB, err := annalstest.Open(ctx, nil) // in your code: pgxpool.New, migrations.Up
	if err != nil {
		panic(err)
	}
	defer func() { _ = closeDB() }()

	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: registry()})
	if err != nil {
		panic(err)
	}
	accounts, err := aggregate.NewRepository(store, "account", func() *Account { return &Account{} },
		&aggregate.Config{Snapshots: &aggregate.SnapshotConfig{Every: 100}})
	if err != nil {
		panic(err)
	}

	if _, err := accounts.Create(ctx, "42", func(a *Account) error { return a.Open("Ada") }); err != nil {
		panic(err)
	}
	acc, err := accounts.Update(ctx, "42", func(a *Account) error { return a.Deposit(100) })
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s has %d at version %d\n", acc.Owner, acc.Balance, acc.Version())

	_, err = accounts.Update(ctx, "42", func(a *Account) error { return a.Withdraw(500) })
	fmt.Println("withdraw 500:", err)

	_, err = accounts.Load(ctx, "43")
	fmt.Println("load 43 not found:", errors.Is(err, aggregate.ErrNotFound))
	// Output:
	// Ada has 100 at version 2
	// withdraw 500: insufficient funds
	// load 43 not found: true
}

// An event type changes shape: v1 stored {"name"}, the code now expects
// {"first", "last"}. The upcaster translates old events on every read; the
// stored event is not rewritten.
func ExampleRepository_upcasting() {
	ctx := context.Background()
	db, closeDB, err := annalstest.Open(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer func() { _ = closeDB() }()

	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Renamed](reg, "member.renamed")
	reg.MustRegisterUpcaster("member.renamed", 1, func(d json.RawMessage) (json.RawMessage, error) {
		var v1 struct{ Name string }
		if err := json.Unmarshal(d, &v1); err != nil {
			return nil, err
		}
		return json.Marshal(Renamed{First: v1.Name, Last: "(unknown)"})
	})
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg})
	if err != nil {
		panic(err)
	}
	// An event as the old code wrote it: version 1. (Appends through this
	// registry stamp the current version unless the metadata says otherwise.)
	v1 := eventstore.Metadata{Extra: map[string]any{eventstore.SchemaVersionKey: 1}}
	if _, err := store.Append(ctx, "member-1", eventstore.NoStream,
		eventstore.EventData{Type: "member.renamed", Data: json.RawMessage(`{"name":"Ada"}`), Metadata: v1}); err != nil {
		panic(err)
	}
	members, err := aggregate.NewRepository(store, "member", func() *Member { return &Member{} }, nil)
	if err != nil {
		panic(err)
	}
	m, err := members.Load(ctx, "1")
	if err != nil {
		panic(err)
	}
	fmt.Println(m.First, m.Last)
	// Output: Ada (unknown)
}
