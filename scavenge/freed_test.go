package scavenge_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/scavenge"
)

// What a scavenge run frees and what it keeps (docs/guarantees.md, items 14
// and 15): the ID of a removed event is free again, so re-appending it
// appends a new event where before the run it was an idempotent no-op (or,
// in another stream, a conflict); and a hard-deleted stream's row stays as
// its tombstone, refusing every append after its events are gone.
func TestScavengeFreesIDsKeepsTombstones(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	withID := func(id uuid.UUID) eventstore.EventData {
		return eventstore.EventData{ID: id, Type: "thing.happened", Data: map[string]any{"n": 1}}
	}
	truncated, kept, buried := uuid.New(), uuid.New(), uuid.New()
	first, err := store.Append(ctx, "trunc", eventstore.NoStream, withID(truncated), withID(kept))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "hard", eventstore.NoStream, withID(buried)); err != nil {
		t.Fatal(err)
	}
	tb := int64(2)
	if _, err := store.SetStreamRetention(ctx, "trunc", eventstore.RetentionChange{TruncateBefore: &tb}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.DeleteStream(ctx, "hard", eventstore.Any, &eventstore.DeleteOptions{Hard: true}); err != nil {
		t.Fatal(err)
	}

	// Before the run the IDs are still taken: hidden by retention or by the
	// tombstone, the events are in the log.
	res, err := store.Append(ctx, "trunc", eventstore.Any, withID(truncated))
	if err != nil || res.StreamVersion != 1 || res.Events[0].GlobalSequence != first.Events[0].GlobalSequence {
		t.Fatalf("re-append of a truncated event before scavenging: %+v %v, want the stored position", res, err)
	}
	if _, err := store.Append(ctx, "elsewhere", eventstore.Any, withID(buried)); !errors.Is(err, eventstore.ErrEventIDConflict) {
		t.Fatalf("the ID of a hard-deleted stream's event in another stream before scavenging: %v, want ErrEventIDConflict", err)
	}

	s, err := scavenge.New(db.Pool, &scavenge.Config{Pause: -1, InstanceID: "freed",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := s.RunOnce(ctx); err != nil || !p.Done || p.Removed != 3 {
		t.Fatalf("scavenge: %+v %v, want 3 events removed (trunc v1, hard v1 and its deletion)", p, err)
	}

	head, err := store.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err = store.Append(ctx, "trunc", eventstore.Any, withID(truncated))
	if err != nil || res.StreamVersion != 3 || res.Events[0].GlobalSequence <= head {
		t.Fatalf("re-append of a scavenged event: %+v %v, want a new event at version 3 past the head %d", res, err, head)
	}
	// The ID of an event that survived is still taken.
	if res, err := store.Append(ctx, "trunc", eventstore.Any, withID(kept)); err != nil || res.StreamVersion != 2 {
		t.Fatalf("re-append of a kept event: %+v %v, want the stored version 2", res, err)
	}
	if res, err := store.Append(ctx, "elsewhere", eventstore.NoStream, withID(buried)); err != nil || res.StreamVersion != 1 {
		t.Fatalf("the ID of a scavenged hard-deleted event in another stream: %+v %v, want a new event", res, err)
	}

	// The tombstone outlives its events.
	for _, exp := range []eventstore.ExpectedVersion{eventstore.Any, eventstore.NoStream, eventstore.Exact(2)} {
		if _, err := store.Append(ctx, "hard", exp, withID(uuid.New())); !errors.Is(err, eventstore.ErrStreamTombstoned) {
			t.Fatalf("append with %s to a scavenged hard-deleted stream: %v, want ErrStreamTombstoned", exp, err)
		}
	}
	if info, err := store.StreamInfo(ctx, "hard"); err != nil || info.State != eventstore.StreamHardDeleted || info.Version != 2 {
		t.Fatalf("the scavenged tombstone: %+v %v", info, err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.events WHERE stream_id = 'hard'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d events of the hard-deleted stream left (%v), want 0", n, err)
	}
}
