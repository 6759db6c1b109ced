package aggregate_test

import (
	"context"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
)

// A deleted stream does not load; once recreated it loads from its first
// new event, ignoring the snapshot taken before the delete.
func TestLoadDeletedAndRecreated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	l := &loads{}
	r := snapRepo(t, b, 1, l, nil)
	history(t, r, 5) // 6 events: a snapshot at 5
	stream := r.StreamID("1")
	if _, err := b.store.DeleteStream(ctx, stream, eventstore.Exact(6), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Load(ctx, "1"); !errors.Is(err, eventstore.ErrStreamDeleted) {
		t.Fatalf("load of a deleted aggregate: %v", err)
	}
	if _, err := b.store.Append(ctx, stream, eventstore.Exact(7), eventstore.NewEvent(Opened{Owner: "bob"}), eventstore.NewEvent(Deposited{Amount: 3})); err != nil {
		t.Fatal(err)
	}
	a, err := r.Load(ctx, "1")
	if err != nil {
		t.Fatal(err)
	}
	if a.Owner != "bob" || a.Balance != 3 || a.Deposits != 1 || a.Version() != 9 {
		t.Fatalf("recreated aggregate %+v at version %d", *a, a.Version())
	}
	if s := l.last(t); s.SnapshotVersion != 0 || s.EventsRead != 2 {
		t.Fatalf("load stats %+v: want no snapshot, 2 events", s)
	}
	// Saving continues the stream's versions.
	if a, err = r.Update(ctx, "1", func(a *Account) error { return a.Deposit(4) }); err != nil || a.Version() != 10 || a.Balance != 7 {
		t.Fatalf("update after recreation: %+v %v", a, err)
	}
}
