package aggregate_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// BenchmarkLoad loads an account of 1,000 events by full replay and from a
// snapshot (every 100 events: the newest is at version 1,000, so nothing is
// replayed after it, and at 950 events 50 are).
//
//	ANNALS_TEST_DATABASE_URL=… go test -run '^$' -bench BenchmarkLoad -benchtime 200x ./aggregate/
func BenchmarkLoad(b *testing.B) {
	db, closeDB, err := annalstest.Open(context.Background(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = closeDB() }()
	ctx := context.Background()
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: registry()})
	if err != nil {
		b.Fatal(err)
	}
	seed := func(id string, n int) {
		events := []eventstore.EventData{eventstore.NewEvent(Opened{Owner: "ada"})}
		for i := 1; i < n; i++ {
			events = append(events, eventstore.NewEvent(Deposited{Amount: i}))
		}
		if _, err := store.Append(ctx, "account-"+id, eventstore.NoStream, events...); err != nil {
			b.Fatal(err)
		}
	}
	seed("replay", 1000)
	seed("snap", 950)
	snap, err := aggregate.NewRepository(store, "account", newAccount, &aggregate.Config{Snapshots: &aggregate.SnapshotConfig{Every: 100}})
	if err != nil {
		b.Fatal(err)
	}
	// Bring "snap" to 1,000 through the repository: the snapshot is at 1,000.
	if _, err := snap.Update(ctx, "snap", func(a *Account) error {
		for range 50 {
			if err := a.Deposit(1); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	plain, err := aggregate.NewRepository(store, "account", newAccount, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		r    *aggregate.Repository[*Account]
		id   string
	}{{"Replay1000", plain, "replay"}, {"Snapshot1000", snap, "snap"}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				a, err := c.r.Load(ctx, c.id)
				if err != nil || a.Version() != 1000 {
					b.Fatal(fmt.Sprint(err, a))
				}
			}
		})
	}
}
