package aggregate_test

import (
	"context"
	"fmt"
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

// A truncated stream loads as the fold of its visible events, with or
// without a snapshot: a snapshot that folds events below truncate_before is
// ignored, and snapshots written after the truncation (folding only the
// visible events) are used again.
func TestLoadTruncated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	l := &loads{}
	r := snapRepo(t, b, 1, l, nil)
	replay := repo(t, b, nil)
	history(t, r, 11) // 12 events: a snapshot at 10
	tb := int64(8)
	if _, err := b.store.SetStreamRetention(ctx, "account-1", eventstore.RetentionChange{TruncateBefore: &tb}); err != nil {
		t.Fatal(err)
	}
	same := func(want string) {
		t.Helper()
		a, err := r.Load(ctx, "1")
		if err != nil {
			t.Fatal(err)
		}
		w, err := replay.Load(ctx, "1")
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprintf("%s/%d/%d@%d", a.Owner, a.Balance, a.Deposits, a.Version())
		if rep := fmt.Sprintf("%s/%d/%d@%d", w.Owner, w.Balance, w.Deposits, w.Version()); got != rep || got != want {
			t.Fatalf("load %s (stats %+v), replay %s; want %s", got, l.last(t), rep, want)
		}
	}
	// Versions 8..12 are deposits of 7..11.
	same("/45/5@12")
	if s := l.last(t); s.SnapshotVersion != 0 || s.EventsRead != 5 {
		t.Fatalf("load stats %+v: want the snapshot ignored, 5 events read", s)
	}
	// Saves write snapshots of the visible events, and loads use them.
	for range 3 {
		if _, err := r.Update(ctx, "1", func(a *Account) error { return a.Deposit(1) }); err != nil {
			t.Fatal(err)
		}
	}
	same("/48/8@15")
	if s := l.last(t); s.SnapshotVersion != 15 || s.EventsRead != 0 {
		t.Fatalf("load stats %+v: want the snapshot at 15 used", s)
	}
	// An aggregate loaded before a truncation and saved after it writes no
	// snapshot (it folds the events now hidden).
	a, err := r.Load(ctx, "1")
	if err != nil {
		t.Fatal(err)
	}
	tb = 14
	if _, err := b.store.SetStreamRetention(ctx, "account-1", eventstore.RetentionChange{TruncateBefore: &tb}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := a.Deposit(1); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Save(ctx, a); err != nil {
		t.Fatal(err)
	}
	var version int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT stream_version FROM annals.snapshots WHERE stream_id = 'account-1'`).Scan(&version); err != nil || version != 15 {
		t.Fatalf("snapshot at %d (%v), want still 15", version, err)
	}
	same("/7/7@20") // 14..20: deposits of 1
}

// A stream with a maximum count loads as the fold of its newest events,
// with or without snapshots.
func TestLoadMaxCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	l := &loads{}
	r := snapRepo(t, b, 1, l, nil)
	replay := repo(t, b, nil)
	history(t, r, 6) // 7 events: a snapshot at 5
	n := int64(10)
	if _, err := b.store.SetStreamRetention(ctx, "account-1", eventstore.RetentionChange{MaxCount: &n}); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		if _, err := r.Update(ctx, "1", func(a *Account) error { return a.Deposit(1) }); err != nil {
			t.Fatal(err)
		}
		a, err := r.Load(ctx, "1")
		if err != nil {
			t.Fatal(err)
		}
		w, err := replay.Load(ctx, "1")
		if err != nil {
			t.Fatal(err)
		}
		if a.Owner != w.Owner || a.Balance != w.Balance || a.Deposits != w.Deposits || a.Version() != w.Version() {
			t.Fatalf("after %d more deposits: load %+v (stats %+v), replay %+v", i+1, *a, l.last(t), *w)
		}
	}
}

// A snapshot that older code wrote records no first version: it is taken
// to fold the stream from version 1, and so is used only while no event of
// the stream is hidden. So is a row older code overwrote (its
// checked_version is not its stream_version).
func TestLoadSnapshotOfOlderCode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	l := &loads{}
	r := snapRepo(t, b, 1, l, nil)
	history(t, r, 4) // 5 events: a snapshot at 5
	if _, err := b.db.Pool.Exec(ctx, `UPDATE annals.snapshots SET first_version = NULL, checked_version = NULL,
		state = '{"owner":"old","balance":1000,"deposits":4}'`); err != nil {
		t.Fatal(err)
	}
	if a, err := r.Load(ctx, "1"); err != nil || a.Balance != 1000 || l.last(t).SnapshotVersion != 5 {
		t.Fatalf("load: %+v %v %+v, want the old row used", a, err, l.last(t))
	}
	tb := int64(3)
	if _, err := b.store.SetStreamRetention(ctx, "account-1", eventstore.RetentionChange{TruncateBefore: &tb}); err != nil {
		t.Fatal(err)
	}
	if a, err := r.Load(ctx, "1"); err != nil || a.Balance != 9 || a.Owner != "" || l.last(t).SnapshotVersion != 0 {
		t.Fatalf("load after truncation: %+v %v %+v, want the old row ignored", a, err, l.last(t))
	}
	// A row of this code, folding 3..10, then overwritten by older code.
	for i := range 5 {
		if _, err := r.Update(ctx, "1", func(a *Account) error { return a.Deposit(i + 10) }); err != nil {
			t.Fatal(err)
		}
	}
	var first, checked int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT first_version, checked_version FROM annals.snapshots`).Scan(&first, &checked); err != nil || first != 3 || checked != 10 {
		t.Fatalf("snapshot row: first %d checked %d (%v), want 3 and 10", first, checked, err)
	}
	if a, err := r.Load(ctx, "1"); err != nil || a.Balance != 69 || l.last(t).SnapshotVersion != 10 {
		t.Fatalf("load: %+v %v %+v, want balance 69 from the snapshot at 10", a, err, l.last(t))
	}
	if _, err := b.db.Pool.Exec(ctx, `UPDATE annals.snapshots SET stream_version = 9, state = '{"owner":"old","balance":1000,"deposits":4}'`); err != nil {
		t.Fatal(err)
	}
	if a, err := r.Load(ctx, "1"); err != nil || a.Balance != 69 || l.last(t).SnapshotVersion != 0 {
		t.Fatalf("load: %+v %v %+v, want the overwritten row ignored", a, err, l.last(t))
	}
}
