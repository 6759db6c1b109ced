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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
)

// nulCase is an event holding a NUL character (\u0000) somewhere: as the
// Go client is given it (ev), and as the JSON text of its type, data and
// metadata (for encoded appends and SQL calls).
type nulCase struct {
	name             string
	ev               eventstore.EventData
	typ, data, meta  string // JSON texts; meta "" for none
	field            string // the field the error names
	goOnly, sqlNever bool
}

func nulCases() []nulCase {
	return []nulCase{
		{name: "DataValue", ev: eventstore.EventData{Type: "t", Data: json.RawMessage(`{"a": "x\u0000y"}`)},
			typ: `"t"`, data: `{"a": "x\u0000y"}`, field: "data"},
		{name: "DataKey", ev: eventstore.EventData{Type: "t", Data: json.RawMessage(`[{"a\u0000": 1}]`)},
			typ: `"t"`, data: `[{"a\u0000": 1}]`, field: "data"},
		{name: "GoString", ev: eventstore.EventData{Type: "t", Data: map[string]string{"a": "x\x00y"}},
			typ: `"t"`, data: `{"a":"x\u0000y"}`, field: "data"},
		{name: "Metadata", ev: eventstore.EventData{Type: "t", Data: json.RawMessage(`{}`),
			Metadata: eventstore.Metadata{Extra: map[string]any{"k": "x\x00y"}}},
			typ: `"t"`, data: `{}`, meta: `{"k": "x\u0000y"}`, field: "metadata"},
	}
}

// encodedWith returns an encoded append of a good event and then the
// event of c, as JSON texts.
func (c nulCase) encoded(stream string) eventstore.EncodedAppend {
	bad := fmt.Sprintf(`{"event_id":"%s","type":%s,"data":%s`, uuid.New(), c.typ, c.data)
	if c.meta != "" {
		bad += `,"metadata":` + c.meta
	}
	events := fmt.Sprintf(`[{"event_id":"%s","type":"t","data":{"ok":true}},%s}]`, uuid.New(), bad)
	return eventstore.EncodedAppend{StreamID: stream, Expected: eventstore.Any, Events: json.RawMessage(events), Count: 2}
}

// wantNUL fails t unless err is the *InvalidEventError of a NUL character
// in field of event n (its reason names it, or says, as append_one's and
// append_batch's do for metadata, that jsonb cannot hold the field).
func wantNUL(t *testing.T, what string, err error, n int, field string) {
	t.Helper()
	var inv *eventstore.InvalidEventError
	if !errors.As(err, &inv) || !errors.Is(err, eventstore.ErrInvalidEvent) {
		t.Errorf("%s: %v, want an *InvalidEventError", what, err)
		return
	}
	if inv.Event != n || inv.Field != field || !(strings.Contains(inv.Error(), `\u0000`) || strings.Contains(inv.Error(), "NUL") ||
		strings.Contains(inv.Error(), "jsonb can hold")) {
		t.Errorf("%s: %v (event %d, field %q), want event %d, field %q, naming \\u0000 or NUL", what, err, inv.Event, inv.Field, n, field)
	}
}

// A NUL character (\u0000) in an event's data (a value or a key, raw JSON
// or a Go string) or metadata is refused on every path of the Go client,
// with an *InvalidEventError naming the event and the field, before
// anything is sent: group commit (append_one, append_batch), Append alone
// and through an inline projection, AppendTx and Transact (append_events_json,
// or append_events for a role without it), Encode, encoded appends
// (AppendEncodedTx, Batch.AppendEncoded: a hand-built or stored one), and
// DeleteStream's metadata. Encoded appends reached append_events_json and
// append_events, which answered a bare 22P05; the others were refused
// already. Nothing is written.
func TestNULRefusedOnEveryPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	// Stores on a closed pool: an append they sent would fail with the
	// pool's error, so a refusal from them was made before sending.
	closed, err := pgxpool.New(ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	newStore := func(pool *pgxpool.Pool, cfg eventstore.Config) *eventstore.Store {
		t.Helper()
		cfg.Registry = b.reg
		s, err := eventstore.New(pool, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	offline := newStore(closed, eventstore.Config{})
	offlineAlone := newStore(closed, eventstore.Config{GroupCommit: eventstore.GroupCommit{Disabled: true}})
	offlineInline := newStore(closed, eventstore.Config{Inline: []eventstore.InlineProjection{&countInline{}}})
	jsonb := newStore(b.db.Pool, eventstore.Config{})
	eventstore.AppendThroughJSONB(jsonb)
	good := eventstore.EventData{Type: "t", Data: json.RawMessage(`{"ok": true}`)}

	// inTx runs fn in a transaction of b's pool and requires the
	// transaction to be usable afterwards: no statement of fn failed in it.
	inTx := func(t *testing.T, what string, fn func(tx pgx.Tx) error) error {
		t.Helper()
		tx, err := b.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		ferr := fn(tx)
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Errorf("%s: the transaction failed afterwards (a statement was sent and refused): %v", what, err)
		}
		return ferr
	}

	for _, c := range nulCases() {
		t.Run(c.name, func(t *testing.T) {
			stream := "nul-" + c.name
			two := []eventstore.EventData{good, c.ev}
			for _, p := range []struct {
				name   string
				events int // the bad event's place
				run    func() error
			}{
				{"Append/append_one", 1, func() error { _, err := offline.Append(ctx, stream, eventstore.Any, c.ev); return err }},
				{"Append/append_batch", 2, func() error { _, err := offline.Append(ctx, stream, eventstore.Any, two...); return err }},
				{"Append/alone", 2, func() error { _, err := offlineAlone.Append(ctx, stream, eventstore.Any, two...); return err }},
				{"Append/inline", 2, func() error { _, err := offlineInline.Append(ctx, stream, eventstore.Any, two...); return err }},
				{"Encode", 2, func() error { _, err := offline.Encode(ctx, stream, eventstore.Any, two...); return err }},
				{"AppendTx", 2, func() error {
					return inTx(t, "AppendTx", func(tx pgx.Tx) error { _, err := b.store.AppendTx(ctx, tx, stream, eventstore.Any, two...); return err })
				}},
				{"AppendTx/append_events", 2, func() error {
					return inTx(t, "AppendTx", func(tx pgx.Tx) error { _, err := jsonb.AppendTx(ctx, tx, stream, eventstore.Any, two...); return err })
				}},
				{"Transact", 2, func() error {
					_, err := b.store.Transact(ctx, func(_ context.Context, _ pgx.Tx, batch *eventstore.Batch) error {
						return batch.Append(stream, eventstore.Any, two...)
					})
					return err
				}},
				{"AppendEncodedTx", 2, func() error {
					return inTx(t, "AppendEncodedTx", func(tx pgx.Tx) error { _, err := b.store.AppendEncodedTx(ctx, tx, c.encoded(stream)); return err })
				}},
				{"AppendEncodedTx/append_events", 2, func() error {
					return inTx(t, "AppendEncodedTx", func(tx pgx.Tx) error { _, err := jsonb.AppendEncodedTx(ctx, tx, c.encoded(stream)); return err })
				}},
				{"Batch.AppendEncoded", 2, func() error {
					_, err := b.store.Transact(ctx, func(_ context.Context, _ pgx.Tx, batch *eventstore.Batch) error {
						return batch.AppendEncoded(c.encoded(stream))
					})
					return err
				}},
			} {
				wantNUL(t, p.name, p.run(), p.events, c.field)
			}
			if c.field == "metadata" {
				_, err := offline.DeleteStream(ctx, stream, eventstore.Any, &eventstore.DeleteOptions{Metadata: c.ev.Metadata})
				wantNUL(t, "DeleteStream", err, 1, "metadata")
			}
		})
	}
	// A NUL character in an encoded append's type.
	enc := nulCase{typ: `"t\u0000"`, data: `{}`}.encoded("nul-type")
	err = inTx(t, "AppendEncodedTx", func(tx pgx.Tx) error { _, err := b.store.AppendEncodedTx(ctx, tx, enc); return err })
	wantNUL(t, "AppendEncodedTx of a type with NUL", err, 2, "type")
	assertNothingStored(t, b)
}

// assertNothingStored fails t unless b's log has no event and no stream.
func assertNothingStored(t *testing.T, b *bundle) {
	t.Helper()
	var events, streams int
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM annals.events), (SELECT count(*) FROM annals.streams)`).
		Scan(&events, &streams); err != nil {
		t.Fatal(err)
	}
	if events != 0 || streams != 0 {
		t.Errorf("%d events and %d streams stored, want none", events, streams)
	}
}

// What the SQL functions answer for a NUL character (the client's check
// passed by), and how it reaches the Go caller: append_one and
// append_batch refuse it with AN002 (field data or metadata, since 0032),
// append_events_json and append_events with PostgreSQL's 22P05 (the text
// of their argument is parsed before any check of theirs runs); the Go
// client turns each into the *InvalidEventError its own check gives, naming
// the event and the field. Nothing is written.
func TestNULRefusedByTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	alone, err := eventstore.New(b.db.Pool, &eventstore.Config{Registry: b.reg})
	if err != nil {
		t.Fatal(err)
	}
	jsonb, err := eventstore.New(b.db.Pool, &eventstore.Config{Registry: b.reg})
	if err != nil {
		t.Fatal(err)
	}
	eventstore.AppendThroughJSONB(jsonb)
	for _, c := range nulCases() {
		if c.name == "GoString" {
			continue // the same text as DataValue
		}
		t.Run(c.name, func(t *testing.T) {
			var meta []byte
			if c.meta != "" {
				meta = []byte(c.meta)
			}
			for _, p := range []struct {
				name       string
				store      *eventstore.Store
				path       string
				n, atEvent int
			}{
				{"append_one", b.store, "group", 1, 1},
				{"append_batch", b.store, "group", 2, 1}, // append_batch names the first bad event
				{"append_events_json", alone, "alone", 2, 1},
				{"append_events", jsonb, "alone", 2, 1},
			} {
				_, err := eventstore.AppendUnchecked(ctx, p.store, p.path, "server-"+c.name, "t", []byte(c.data), meta, p.n)
				wantNUL(t, p.name, err, p.atEvent, c.field)
			}
			for _, s := range []*eventstore.Store{alone, jsonb} {
				tx, err := b.db.Pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				_, err = eventstore.AppendEncodedUncheckedTx(ctx, s, tx, c.encoded("server-"+c.name))
				_ = tx.Rollback(ctx)
				wantNUL(t, "an encoded append", err, 2, c.field)
			}

			// The SQL API, called as docs/sql-api.md shows.
			id := uuid.NewString()
			element := fmt.Sprintf(`[{"event_id":"%s","type":%s,"data":%s`, id, c.typ, c.data)
			if c.meta != "" {
				element += `,"metadata":` + c.meta
			}
			element += "}]"
			var metaArg any
			if c.meta != "" {
				metaArg = c.meta
			}
			for _, q := range []struct {
				sql  string
				args []any
				code string
			}{
				{`SELECT * FROM annals.append_events('sql', NULL, $1::jsonb)`, []any{element}, "22P05"},
				{`SELECT * FROM annals.append_events_json('sql', NULL, $1::json)`, []any{element}, "22P05"},
				{`SELECT * FROM annals.append_one('sql', NULL, $1, 't', $2, $3, false)`, []any{id, c.data, metaArg}, "AN002"},
				{`SELECT * FROM annals.append_batch(ARRAY['sql'], ARRAY[NULL]::bigint[], ARRAY[1], ARRAY[1], ARRAY[$1::uuid],
					ARRAY['t'], ARRAY[$2::text], ARRAY[$3::text], false)`, []any{id, c.data, metaArg}, "AN002"},
			} {
				_, err := b.db.Pool.Exec(ctx, q.sql, q.args...)
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != q.code {
					t.Errorf("%s: %v, want SQLSTATE %s", q.sql, err, q.code)
				} else if q.code == "AN002" && !strings.Contains(pgErr.Message, c.field) {
					t.Errorf("%s: %v, want it to name %s", q.sql, err, c.field)
				}
			}
		})
	}
	assertNothingStored(t, b)
}
