package eventstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
)

// rawData has what jsonb would change: key order, white space, a duplicate
// key, a number it spells out, and characters encoding/json escapes.
const rawData = `{"zeta": 1, "a":  2.50, "dup": 1, "dup": 2, "e": 1e2, "html": "<b> & </b>"}`

// appendPaths runs one append of events to stream through each path that
// appends in a transaction, or alone through the same SQL function: AppendTx,
// Transact (Batch.Append), an encoded append staged in Transact and one
// appended with AppendEncodedTx, Append through an inline projection, and
// Append without group commit.
func appendPaths(t *testing.T, b *bundle) map[string]func(ctx context.Context, stream string, exp eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
	t.Helper()
	inline, err := eventstore.New(b.db.Pool, &eventstore.Config{Registry: b.reg, Inline: []eventstore.InlineProjection{&countInline{}}})
	if err != nil {
		t.Fatal(err)
	}
	alone, err := eventstore.New(b.db.Pool, &eventstore.Config{Registry: b.reg, GroupCommit: eventstore.GroupCommit{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	s := b.store
	return map[string]func(ctx context.Context, stream string, exp eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error){
		"AppendTx": func(ctx context.Context, stream string, exp eventstore.ExpectedVersion, events ...eventstore.EventData) (res eventstore.AppendResult, err error) {
			err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				res, err = s.AppendTx(ctx, tx, stream, exp, events...)
				return err
			})
			return res, err
		},
		"Transact": func(ctx context.Context, stream string, exp eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
			rs, err := s.Transact(ctx, func(_ context.Context, _ pgx.Tx, batch *eventstore.Batch) error {
				return batch.Append(stream, exp, events...)
			})
			if err != nil {
				return eventstore.AppendResult{}, err
			}
			return rs[0], nil
		},
		"AppendEncoded": func(ctx context.Context, stream string, exp eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
			enc, err := s.Encode(ctx, stream, exp, events...)
			if err != nil {
				return eventstore.AppendResult{}, err
			}
			rs, err := s.Transact(ctx, func(_ context.Context, _ pgx.Tx, batch *eventstore.Batch) error {
				return batch.AppendEncoded(enc)
			})
			if err != nil {
				return eventstore.AppendResult{}, err
			}
			return rs[0], nil
		},
		"AppendEncodedTx": func(ctx context.Context, stream string, exp eventstore.ExpectedVersion, events ...eventstore.EventData) (res eventstore.AppendResult, err error) {
			enc, err := s.Encode(ctx, stream, exp, events...)
			if err != nil {
				return eventstore.AppendResult{}, err
			}
			err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				res, err = s.AppendEncodedTx(ctx, tx, enc)
				return err
			})
			return res, err
		},
		"Inline": func(ctx context.Context, stream string, exp eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
			return inline.Append(ctx, stream, exp, events...)
		},
		"Alone": func(ctx context.Context, stream string, exp eventstore.ExpectedVersion, events ...eventstore.EventData) (eventstore.AppendResult, error) {
			return alone.Append(ctx, stream, exp, events...)
		},
	}
}

// storedText returns the data and metadata of the event at pos as stored.
func storedText(t *testing.T, b *bundle, pos int64) (data, meta string) {
	t.Helper()
	var m *string
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT data::text, metadata::text FROM annals.events WHERE global_sequence = $1`, pos).
		Scan(&data, &m); err != nil {
		t.Fatal(err)
	}
	if m != nil {
		meta = *m
	}
	return data, meta
}

// Every append made in a transaction (and the lone one without group
// commit) stores data and metadata as sent, as Append's group commit does:
// they went through append_events, whose jsonb argument rewrote them (keys
// sorted, a duplicate key dropped, 1e2 spelled 100). White space around
// the data is no part of it on any path.
func TestTransactionalAppendsKeepBytes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	md := eventstore.Metadata{CorrelationID: "c-1", Extra: map[string]any{"n": json.RawMessage(`1e2`), "z": 1, "b": 2}}
	grouped, err := b.store.Append(ctx, "grouped", eventstore.Any, eventstore.EventData{Type: "raw", Data: json.RawMessage(rawData + " \n"), Metadata: md})
	if err != nil {
		t.Fatal(err)
	}
	data, wantMeta := storedText(t, b, grouped.Events[0].GlobalSequence)
	if data != rawData || !strings.Contains(wantMeta, `1e2`) {
		t.Fatalf("Append stored %s and %s, want %s and metadata with 1e2", data, wantMeta, rawData)
	}
	for name, appendVia := range appendPaths(t, b) {
		t.Run(name, func(t *testing.T) {
			res, err := appendVia(ctx, "s-"+name, eventstore.NoStream,
				eventstore.EventData{Type: "raw", Data: json.RawMessage(" \n" + rawData + "\t "), Metadata: md},
				eventstore.EventData{Type: "raw", Data: json.RawMessage(`[1E+2, {"b":1,"a":0}]`)})
			if err != nil {
				t.Fatal(err)
			}
			data, meta := storedText(t, b, res.Events[0].GlobalSequence)
			if data != rawData {
				t.Errorf("data stored as\n%s\nwant, as sent,\n%s", data, rawData)
			}
			if meta != wantMeta {
				t.Errorf("metadata stored as\n%s\nwant, as Append stores it,\n%s", meta, wantMeta)
			}
			if data, _ := storedText(t, b, res.Events[1].GlobalSequence); data != `[1E+2, {"b":1,"a":0}]` {
				t.Errorf("second event's data stored as %s", data)
			}
		})
	}
}

// hugeNumbers is 100 keys of 1e131000: 1.5 KB that jsonb holds (numeric
// takes 131072 digits before the point) and spells out, 131,001 bytes each.
func hugeNumbers() json.RawMessage {
	parts := make([]string, 100)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"k%d":1e131000`, i)
	}
	return json.RawMessage("{" + strings.Join(parts, ",") + "}")
}

// MaxEventBytes is measured on what is sent, and an append made in a
// transaction stores what was sent: 1.5 KB of 1e131000s at a limit of
// exactly their size is stored as those 1.5 KB (through append_events, as
// 13 MB, thirteen times the default limit), and one byte less is refused.
func TestTransactionalAppendStoresWhatMaxEventBytesMeasured(t *testing.T) {
	t.Parallel()
	data := hugeNumbers()
	b := setup(t, &eventstore.Config{MaxEventBytes: len(data)})
	ctx := context.Background()
	for name, appendVia := range appendPaths(t, b) {
		t.Run(name, func(t *testing.T) {
			res, err := appendVia(ctx, "huge-"+name, eventstore.Any, eventstore.EventData{Type: "huge", Data: data})
			if err != nil {
				t.Fatal(err)
			}
			var n int
			if err := b.db.Pool.QueryRow(ctx, `SELECT octet_length(data::text) FROM annals.events WHERE global_sequence = $1`,
				res.Events[0].GlobalSequence).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != len(data) {
				t.Fatalf("%d bytes of data stored for %d sent, with MaxEventBytes %d", n, len(data), len(data))
			}
		})
	}
	small, err := eventstore.New(b.db.Pool, &eventstore.Config{Registry: b.reg, MaxEventBytes: len(data) - 1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = small.Transact(ctx, func(_ context.Context, _ pgx.Tx, batch *eventstore.Batch) error {
		return batch.Append("huge-small", eventstore.Any, eventstore.EventData{Type: "huge", Data: data})
	})
	var ie *eventstore.InvalidEventError
	if !errors.As(err, &ie) || ie.Field != "data+metadata" || ie.Limit != len(data)-1 {
		t.Fatalf("Transact over MaxEventBytes: %v, want an *InvalidEventError for data+metadata", err)
	}
}

// A number beyond numeric's range, which jsonb cannot hold, is stored by an
// append in a transaction as by Append (it failed with a bare 22003, the
// jsonb argument refusing it); in personal data (which annals reads as
// jsonb) it is refused with ErrInvalidEvent, as append_one refuses it.
func TestTransactionalAppendOfANumberJsonbCannotHold(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	const data = `{"n":1e200000}`
	grouped, err := b.store.Append(ctx, "grouped", eventstore.Any, eventstore.EventData{Type: "n", Data: json.RawMessage(data)})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := storedText(t, b, grouped.Events[0].GlobalSequence)
	for name, appendVia := range appendPaths(t, b) {
		t.Run(name, func(t *testing.T) {
			res, err := appendVia(ctx, "n-"+name, eventstore.Any, eventstore.EventData{Type: "n", Data: json.RawMessage(data)})
			if err != nil {
				t.Fatalf("append of %s: %v", data, err)
			}
			if got, _ := storedText(t, b, res.Events[0].GlobalSequence); got != want {
				t.Errorf("stored %s; Append stored %s", got, want)
			}
		})
	}
	_, err = b.store.Transact(ctx, func(_ context.Context, _ pgx.Tx, batch *eventstore.Batch) error {
		return batch.AppendEncoded(eventstore.EncodedAppend{StreamID: "personal", Expected: eventstore.Any, Count: 1,
			Events: json.RawMessage(`[{"event_id":"` + uuid.NewString() + `","type":"p","data":{"email":{"$personal":{}},"n":1e200000}}]`)})
	})
	var ie *eventstore.InvalidEventError
	if !errors.As(err, &ie) || ie.Event != 1 || ie.Field != "data" {
		t.Fatalf("personal data holding 1e200000: %v, want an *InvalidEventError for event 1, data", err)
	}
}

// A retry of an append made in a transaction, with the same event IDs,
// answers the stored positions and writes nothing: when the original
// stored the same bytes (a number jsonb cannot hold among them), and when
// it was stored in jsonb's spelling (through append_events, as before
// migration 0035). Other data under a stored ID is ErrEventIDConflict,
// also when one of the two holds a number jsonb cannot hold.
func TestTransactionalRetryIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	appendTx := appendPaths(t, b)["AppendTx"]
	for _, data := range []string{rawData, `{"n":1e200000, "m": 1}`} {
		e := eventstore.EventData{ID: uuid.New(), Type: "raw", Data: json.RawMessage(data)}
		first, err := appendTx(ctx, "retry", eventstore.Any, e, eventstore.EventData{ID: uuid.New(), Type: "raw", Data: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		// Any expected version, and one the first append made wrong.
		for _, exp := range []eventstore.ExpectedVersion{eventstore.Any, eventstore.NoStream} {
			again, err := appendTx(ctx, "retry", exp, e, eventstore.EventData{ID: first.Events[1].ID, Type: "raw", Data: json.RawMessage(`{}`)})
			if err != nil || again.Events[0] != first.Events[0] || again.Events[1] != first.Events[1] {
				t.Fatalf("retry of %s with %v: %+v, %v; want %+v", data, exp, again, err, first)
			}
		}
		other := e
		other.Data = json.RawMessage(`{"n":1e200001}`)
		if _, err := appendTx(ctx, "retry", eventstore.Any, other); !errors.Is(err, eventstore.ErrEventIDConflict) {
			t.Fatalf("other data under a stored ID: %v, want ErrEventIDConflict", err)
		}
	}
	if n := countEvents(t, b, "retry"); n != 4 {
		t.Fatalf("%d events in the stream, want 4", n)
	}

	id := uuid.New()
	if _, err := b.db.Pool.Exec(ctx, `SELECT * FROM annals.append_events('old', NULL, $1::jsonb)`,
		`[{"event_id":"`+id.String()+`","type":"raw","data":`+rawData+`}]`); err != nil {
		t.Fatal(err)
	}
	res, err := appendTx(ctx, "old", eventstore.NoStream, eventstore.EventData{ID: id, Type: "raw", Data: json.RawMessage(rawData)})
	if err != nil || res.Events[0].ID != id || res.StreamVersion != 1 {
		t.Fatalf("retry of an append stored in jsonb's spelling: %+v, %v", res, err)
	}
	if n := countEvents(t, b, "old"); n != 1 {
		t.Fatalf("%d events in the stream, want 1", n)
	}
}

func countEvents(t *testing.T, b *bundle, stream string) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM annals.events WHERE stream_id = $1`, stream).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A client deployed before `annals migrate` added append_events_json (a
// schema at 0034), or running as a role an older annals grant made, appends
// in transactions through append_events, as it did before (jsonb's
// spelling), rather than failing.
func TestTransactionalAppendBeforeMigration0035(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	if _, err := b.db.Pool.Exec(ctx, `DROP FUNCTION annals.append_events_json(text, bigint, json)`); err != nil {
		t.Fatal(err)
	}
	for name, appendVia := range appendPaths(t, b) {
		t.Run(name, func(t *testing.T) {
			for i := range 2 {
				res, err := appendVia(ctx, "old-"+name, eventstore.Exact(int64(i)), eventstore.EventData{Type: "raw", Data: json.RawMessage(`{"b":1,"a":2}`)})
				if err != nil || res.StreamVersion != int64(i+1) {
					t.Fatalf("append %d: %+v, %v", i, res, err)
				}
				if data, _ := storedText(t, b, res.Events[0].GlobalSequence); data != `{"a": 2, "b": 1}` {
					t.Fatalf("stored %s, want jsonb's spelling", data)
				}
			}
			var wrong *eventstore.WrongExpectedVersionError
			if _, err := appendVia(ctx, "old-"+name, eventstore.Exact(1), eventstore.EventData{Type: "raw", Data: json.RawMessage(`{}`)}); !errors.As(err, &wrong) || wrong.Actual != 2 {
				t.Fatalf("wrong expected version: %v, want actual 2", err)
			}
		})
	}
}
