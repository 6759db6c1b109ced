package eventstore_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
)

// An EncodedAppend is measured again when it is appended: an event whose
// data plus metadata is over MaxEventBytes in it (one built by hand, or
// kept where its bytes grew, as a timer row stored as jsonb did: 1e131000
// became 131,001 digits) is refused with an *InvalidEventError naming the
// event, through Batch.AppendEncoded and AppendEncodedTx, and nothing is
// written. One at the limit is appended, and so is the same append encoded
// by Encode. A Count that is not the number of events is malformed.
func TestAppendEncodedChecksEventSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const limit = 100
	b := setup(t, &eventstore.Config{MaxEventBytes: limit})
	// An event with data {"s":"xx…"} of n bytes and metadata {"k":"v"} (9 bytes).
	event := func(id string, n int) string {
		return `{"event_id":"0191d6a4-0000-7000-8000-00000000000` + id + `","type":"t","data":{"s":"` +
			strings.Repeat("x", n-8) + `"},"metadata":{"k":"v"}}`
	}
	at := eventstore.EncodedAppend{StreamID: "s", Expected: eventstore.Any, Count: 2,
		Events: json.RawMessage("[" + event("1", limit-9-1) + "," + event("2", limit-9) + "]")}
	over := at
	over.Events = json.RawMessage("[" + event("3", limit-9) + "," + event("4", limit-9+1) + "]")
	miscounted := at
	miscounted.Count = 1

	for name, a := range map[string]eventstore.EncodedAppend{"over": over, "miscounted": miscounted} {
		_, err := b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
			return batch.AppendEncoded(a)
		})
		if !errors.Is(err, eventstore.ErrInvalidEvent) {
			t.Fatalf("%s: Batch.AppendEncoded = %v, want ErrInvalidEvent", name, err)
		}
		var ie *eventstore.InvalidEventError
		if name == "over" && (!errors.As(err, &ie) || ie.Event != 2 || ie.Field != "data+metadata" || ie.Limit != limit || ie.Actual != limit+1) {
			t.Errorf("over: %v, want an *InvalidEventError: event 2, data+metadata, limit %d, actual %d", err, limit, limit+1)
		}
		tx, err := b.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.AppendEncodedTx(ctx, tx, a); !errors.Is(err, eventstore.ErrInvalidEvent) {
			t.Errorf("%s: AppendEncodedTx = %v, want ErrInvalidEvent", name, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := b.store.StreamVersion(ctx, "s"); !errors.Is(err, eventstore.ErrStreamNotFound) {
		t.Fatalf("stream s at version %d (%v) after refused appends; want none", v, err)
	}

	if _, err := b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
		return batch.AppendEncoded(at)
	}); err != nil {
		t.Fatalf("an encoded append at the limit: %v", err)
	}
	enc, err := b.store.Encode(ctx, "s", eventstore.Any, eventstore.EventData{Type: "t", Data: json.RawMessage(`{"s":"` + strings.Repeat("x", limit-8) + `"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
		return batch.AppendEncoded(enc)
	}); err != nil {
		t.Fatalf("Encode's append of an event at the limit: %v", err)
	}
	// jsonb's rendering of an event at the limit (a timer stored before
	// migration 0033: a space after each colon and comma) is measured
	// compact, as Encode measured it, and is not refused.
	spaced := eventstore.EncodedAppend{StreamID: "s", Expected: eventstore.Any, Count: 1,
		Events: json.RawMessage(`[{"event_id": "0191d6a4-0000-7000-8000-000000000009", "type": "t", "data": {"s": "` +
			strings.Repeat("x", limit-9-8) + `"}, "metadata": {"k": "v"}}]`)}
	if _, err := b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
		return batch.AppendEncoded(spaced)
	}); err != nil {
		t.Fatalf("jsonb's rendering of an event at the limit: %v", err)
	}
	if v, err := b.store.StreamVersion(ctx, "s"); err != nil || v != 4 {
		t.Fatalf("stream s at version %d (%v); want 4", v, err)
	}
}
