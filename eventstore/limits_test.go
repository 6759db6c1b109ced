package eventstore_test

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/eventstore"
)

// logState is what a rejected append must leave unchanged.
type logState struct {
	events, streams int
	head            int64
	versions        string
}

func readLogState(t *testing.T, b *bundle) logState {
	t.Helper()
	var s logState
	err := b.db.Pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM annals.events), (SELECT count(*) FROM annals.streams),
		       (SELECT coalesce(max(global_sequence), 0) FROM annals.events),
		       (SELECT coalesce(string_agg(stream_id || '@' || version, ',' ORDER BY stream_id), '') FROM annals.streams)`).
		Scan(&s.events, &s.streams, &s.head, &s.versions)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func randomID(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(b)
}

// TestInputLimits: every kind of bad input is refused in Go, before any round
// trip, by Append, AppendTx, Batch.Append and Encode alike, with an error
// that matches ErrInvalidEvent and (where it is a limit or a field's content)
// is an *InvalidEventError naming the field and the limit; the log and the
// streams table are unchanged.
func TestInputLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &eventstore.Config{MaxEventBytes: 4096})
	if _, err := b.store.Append(ctx, "existing", eventstore.NoStream, eventstore.NewEvent(OrderShipped{OrderID: "1"})); err != nil {
		t.Fatal(err)
	}
	before := readLogState(t, b)

	raw := func(typ, data string) eventstore.EventData {
		return eventstore.EventData{Type: typ, Data: json.RawMessage(data)}
	}
	withMeta := func(m eventstore.Metadata) eventstore.EventData {
		return eventstore.EventData{Type: "t", Data: json.RawMessage(`{}`), Metadata: m}
	}
	extra := func(k string, v any) eventstore.EventData {
		return withMeta(eventstore.Metadata{Extra: map[string]any{k: v}})
	}
	ok := raw("t", `{}`)
	type want struct {
		event int
		field string
		limit int
	}
	cases := []struct {
		name     string
		stream   string
		expected eventstore.ExpectedVersion
		events   []eventstore.EventData
		want     want // field "" when only errors.Is(ErrInvalidEvent) is asserted
	}{
		{"StreamEmpty", "", eventstore.Any, []eventstore.EventData{ok}, want{0, "stream_id", 0}},
		{"StreamSpaces", "   ", eventstore.Any, []eventstore.EventData{ok}, want{0, "stream_id", 0}},
		{"StreamUnicodeSpaces", "\u3000\u00a0 \u2003", eventstore.Any, []eventstore.EventData{ok}, want{0, "stream_id", 0}},
		{"Stream1MB", strings.Repeat("s", 1<<20), eventstore.Any, []eventstore.EventData{ok}, want{0, "stream_id", eventstore.MaxStreamIDBytes}},
		{"Stream3000Random", randomID(3000), eventstore.Any, []eventstore.EventData{ok}, want{0, "stream_id", eventstore.MaxStreamIDBytes}},
		{"StreamOneOver", strings.Repeat("é", eventstore.MaxStreamIDBytes/2) + "x", eventstore.Any, []eventstore.EventData{ok}, want{0, "stream_id", eventstore.MaxStreamIDBytes}},
		{"StreamNUL", "a\x00b", eventstore.Any, []eventstore.EventData{ok}, want{0, "stream_id", 0}},
		{"StreamInvalidUTF8", "order-\xff\xfe", eventstore.Any, []eventstore.EventData{ok}, want{0, "stream_id", 0}},
		{"StreamNewline", "order\n1", eventstore.Any, []eventstore.EventData{ok}, want{0, "stream_id", 0}},
		{"StreamC1Control", "order\u00851", eventstore.Any, []eventstore.EventData{ok}, want{0, "stream_id", 0}},

		{"TypeEmptyRawData", "s", eventstore.Any, []eventstore.EventData{raw("", `{}`)}, want{}},
		{"TypeSpaces", "s", eventstore.Any, []eventstore.EventData{raw("  \u3000", `{}`)}, want{1, "type", 0}},
		{"Type100KB", "s", eventstore.Any, []eventstore.EventData{raw(strings.Repeat("t", 100<<10), `{}`)}, want{1, "type", eventstore.MaxEventTypeBytes}},
		{"Type1MB", "s", eventstore.Any, []eventstore.EventData{raw(strings.Repeat("t", 1<<20), `{}`)}, want{1, "type", eventstore.MaxEventTypeBytes}},
		{"TypeOneOver", "s", eventstore.Any, []eventstore.EventData{raw(strings.Repeat("t", eventstore.MaxEventTypeBytes+1), `{}`)}, want{1, "type", eventstore.MaxEventTypeBytes}},
		{"TypeNUL", "s", eventstore.Any, []eventstore.EventData{raw("t\x00", `{}`)}, want{1, "type", 0}},
		{"TypeInvalidUTF8", "s", eventstore.Any, []eventstore.EventData{raw("t\xc3", `{}`)}, want{1, "type", 0}},
		{"TypeTab", "s", eventstore.Any, []eventstore.EventData{ok, raw("order\tplaced", `{}`)}, want{2, "type", 0}},

		{"DataNotJSON", "s", eventstore.Any, []eventstore.EventData{raw("t", `{"a":`)}, want{1, "data", 0}},
		{"DataNumber", "s", eventstore.Any, []eventstore.EventData{raw("t", `5`)}, want{1, "data", 0}},
		{"DataString", "s", eventstore.Any, []eventstore.EventData{raw("t", `"text"`)}, want{1, "data", 0}},
		{"DataNull", "s", eventstore.Any, []eventstore.EventData{raw("t", `null`)}, want{1, "data", 0}},
		{"DataGoScalar", "s", eventstore.Any, []eventstore.EventData{{Type: "t", Data: 42}}, want{1, "data", 0}},
		{"DataOverLimit", "s", eventstore.Any, []eventstore.EventData{raw("t", `{"a":"`+strings.Repeat("x", 4096)+`"}`)}, want{1, "data+metadata", 4096}},
		{"DataPlusMetadataOverLimit", "s", eventstore.Any, []eventstore.EventData{{Type: "t", Data: json.RawMessage(`{"a":"` + strings.Repeat("x", 3000) + `"}`),
			Metadata: eventstore.Metadata{Extra: map[string]any{"note": strings.Repeat("y", 1200)}}}}, want{1, "data+metadata", 4096}},
		{"DataRawInvalidUTF8", "s", eventstore.Any, []eventstore.EventData{raw("t", "{\"a\":\"\xff\"}")}, want{1, "data", 0}},
		{"DataRawNULEscape", "s", eventstore.Any, []eventstore.EventData{raw("t", `{"a":"x\u0000y"}`)}, want{1, "data", 0}},
		{"DataRawNULEscapeInKey", "s", eventstore.Any, []eventstore.EventData{raw("t", `{"\u0000":1}`)}, want{1, "data", 0}},
		{"DataRawLoneSurrogate", "s", eventstore.Any, []eventstore.EventData{raw("t", `{"a":"\ud800"}`)}, want{1, "data", 0}},
		{"DataRawLoneLowSurrogate", "s", eventstore.Any, []eventstore.EventData{raw("t", `["\udc00\ud800"]`)}, want{1, "data", 0}},
		{"DataGoStringNUL", "s", eventstore.Any, []eventstore.EventData{{Type: "t", Data: map[string]string{"a": "x\x00"}}}, want{1, "data", 0}},
		{"DataGoStringInvalidUTF8", "s", eventstore.Any, []eventstore.EventData{{Type: "t", Data: map[string]string{"a": "caf\xe9"}}}, want{1, "data", 0}},
		{"DataGoStructInvalidUTF8", "s", eventstore.Any, []eventstore.EventData{eventstore.NewEvent(OrderShipped{OrderID: "\xff"})}, want{1, "data", 0}},

		{"ExpectedNegative", "s", eventstore.ExpectedVersion(-3), []eventstore.EventData{ok}, want{0, "expected_version", 0}},
		{"ExpectedMinInt64", "s", eventstore.ExpectedVersion(math.MinInt64), []eventstore.EventData{ok}, want{0, "expected_version", 0}},
		{"ExpectedOverflows", "s", eventstore.Exact(math.MaxInt64), []eventstore.EventData{ok}, want{0, "expected_version", 0}},
		{"ExpectedOverflowsWithTwo", "s", eventstore.Exact(math.MaxInt64 - 1), []eventstore.EventData{ok, raw("t", `[]`)}, want{0, "expected_version", 0}},

		{"MetaCorrelationInExtra", "s", eventstore.Any, []eventstore.EventData{extra("correlation_id", "req-1")}, want{1, "metadata", 0}},
		{"MetaCausationInExtra", "s", eventstore.Any, []eventstore.EventData{extra("causation_id", 7)}, want{1, "metadata", 0}},
		{"MetaTraceparentNotString", "s", eventstore.Any, []eventstore.EventData{extra("traceparent", 5)}, want{1, "metadata", 0}},
		{"MetaTracestateNotString", "s", eventstore.Any, []eventstore.EventData{extra("tracestate", map[string]any{})}, want{1, "metadata", 0}},
		{"MetaSchemaVersionString", "s", eventstore.Any, []eventstore.EventData{extra(eventstore.SchemaVersionKey, "two")}, want{1, "metadata", 0}},
		{"MetaSchemaVersionZero", "s", eventstore.Any, []eventstore.EventData{extra(eventstore.SchemaVersionKey, 0)}, want{1, "metadata", 0}},
		{"MetaSchemaVersionFraction", "s", eventstore.Any, []eventstore.EventData{extra(eventstore.SchemaVersionKey, 1.5)}, want{1, "metadata", 0}},
		{"MetaKeyOverLimit", "s", eventstore.Any, []eventstore.EventData{extra(strings.Repeat("k", eventstore.MaxMetadataKeyBytes+1), 1)}, want{1, "metadata", eventstore.MaxMetadataKeyBytes}},
		{"MetaKeyInvalidUTF8", "s", eventstore.Any, []eventstore.EventData{extra("k\xff", 1)}, want{1, "metadata", 0}},
		{"MetaKeyNUL", "s", eventstore.Any, []eventstore.EventData{extra("k\x00", 1)}, want{1, "metadata", 0}},
		{"MetaValueInvalidUTF8", "s", eventstore.Any, []eventstore.EventData{extra("k", "v\xff")}, want{1, "metadata", 0}},
		{"MetaCorrelationIDInvalidUTF8", "s", eventstore.Any, []eventstore.EventData{withMeta(eventstore.Metadata{CorrelationID: "\xff"})}, want{1, "metadata", 0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			check := func(how string, err error) {
				t.Helper()
				if !errors.Is(err, eventstore.ErrInvalidEvent) {
					t.Fatalf("%s: err = %v, want ErrInvalidEvent", how, err)
				}
				if c.want.field == "" {
					return
				}
				var ie *eventstore.InvalidEventError
				if !errors.As(err, &ie) {
					t.Fatalf("%s: err = %v, want an *InvalidEventError", how, err)
				}
				if ie.Field != c.want.field || ie.Event != c.want.event || ie.Limit != c.want.limit {
					t.Fatalf("%s: err = %v (event %d, field %q, limit %d), want event %d, field %q, limit %d",
						how, err, ie.Event, ie.Field, ie.Limit, c.want.event, c.want.field, c.want.limit)
				}
				if c.want.limit > 0 && (ie.Actual <= ie.Limit || !strings.Contains(err.Error(), "limit")) {
					t.Fatalf("%s: err = %v: actual %d, limit %d", how, err, ie.Actual, ie.Limit)
				}
			}
			_, err := b.store.Append(ctx, c.stream, c.expected, c.events...)
			check("Append", err)
			_, err = b.store.Encode(ctx, c.stream, c.expected, c.events...)
			check("Encode", err)
			_, err = b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
				return batch.Append(c.stream, c.expected, c.events...)
			})
			check("Batch.Append", err)
			err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				_, err := b.store.AppendTx(ctx, tx, c.stream, c.expected, c.events...)
				if err != nil {
					return err
				}
				return nil
			})
			check("AppendTx", err)
		})
	}
	if after := readLogState(t, b); after != before {
		t.Fatalf("bad input changed the log: before %+v, after %+v", before, after)
	}

	// The limits are inclusive and count bytes: names of exactly the limit,
	// in multi-byte characters, are fine.
	good := []eventstore.EventData{
		{Type: strings.Repeat("ü", eventstore.MaxEventTypeBytes/2), Data: json.RawMessage(`{"a":"\ud83d\ude00 \ufffd \\u0000"}`),
			Metadata: eventstore.Metadata{CorrelationID: "req", Extra: map[string]any{
				strings.Repeat("k", eventstore.MaxMetadataKeyBytes): 1, eventstore.SchemaVersionKey: 1, "traceparent": "00-x"}}},
	}
	stream := strings.Repeat("ß", eventstore.MaxStreamIDBytes/2)
	if _, err := b.store.Append(ctx, stream, eventstore.NoStream, good...); err != nil {
		t.Fatalf("input at the limits refused: %v", err)
	}
	evs, err := collect(t, b.store.ReadStream(ctx, stream, 0))
	// Append stores the data byte for byte (json, through append_batch).
	if err != nil || len(evs) != 1 || evs[0].Type != good[0].Type || string(evs[0].Data) != string(good[0].Data.(json.RawMessage)) {
		t.Fatalf("read back %+v, %v", evs, err)
	}
}

// TestSQLInputLimits calls append_events directly, as a producer in another
// language would: each limit is refused with SQLSTATE AN002 and a DETAIL
// naming the event, field and limit (the same limits as the Go constants),
// nothing is written, and the Go client maps the same refusal to an
// *InvalidEventError when only the server can see it.
func TestSQLInputLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	if _, err := b.store.Append(ctx, "existing", eventstore.NoStream, eventstore.NewEvent(OrderShipped{OrderID: "1"})); err != nil {
		t.Fatal(err)
	}
	before := readLogState(t, b)
	ev := func(typ string, meta string) string {
		if meta == "" {
			return `[{"type":` + jsonString(typ) + `,"data":{}}]`
		}
		return `[{"type":` + jsonString(typ) + `,"data":{},"metadata":` + meta + `}]`
	}
	// Each exponent is 8 bytes as sent and 131,072 digits as PostgreSQL stores it.
	huge := "[" + strings.TrimSuffix(strings.Repeat("1e131071,", 520), ",") + "]"
	type detail struct {
		Event  int    `json:"event"`
		Field  string `json:"field"`
		Limit  *int   `json:"limit"`
		Actual *int64 `json:"actual"`
	}
	cases := []struct {
		name, stream string
		expected     any
		events       string
		want         detail
	}{
		{"StreamOneOver", strings.Repeat("s", eventstore.MaxStreamIDBytes+1), nil, ev("t", ""), detail{0, "stream_id", ptr(eventstore.MaxStreamIDBytes), nil}},
		{"Stream1MB", strings.Repeat("s", 1<<20), nil, ev("t", ""), detail{0, "stream_id", ptr(eventstore.MaxStreamIDBytes), nil}},
		{"StreamSpaces", "  \u3000", nil, ev("t", ""), detail{0, "stream_id", nil, nil}},
		{"StreamControl", "a\x01b", nil, ev("t", ""), detail{0, "stream_id", nil, nil}},
		{"StreamC1Control", "a\u009fb", nil, ev("t", ""), detail{0, "stream_id", nil, nil}},
		{"ExpectedOverflows", "s", int64(math.MaxInt64), ev("t", ""), detail{0, "expected_version", nil, nil}},
		{"TypeOneOver", "s", nil, ev(strings.Repeat("t", eventstore.MaxEventTypeBytes+1), ""), detail{1, "type", ptr(eventstore.MaxEventTypeBytes), nil}},
		{"TypeSpaces", "s", nil, ev(" \u2003 ", ""), detail{1, "type", nil, nil}},
		{"TypeNewline", "s", nil, ev("a\nb", ""), detail{1, "type", nil, nil}},
		{"MetaKeyOneOver", "s", nil, ev("t", `{"`+strings.Repeat("k", eventstore.MaxMetadataKeyBytes+1)+`":1}`), detail{1, "metadata", ptr(eventstore.MaxMetadataKeyBytes), nil}},
		{"MetaCorrelationNotString", "s", nil, ev("t", `{"correlation_id":5}`), detail{1, "metadata", nil, nil}},
		{"MetaTraceparentNotString", "s", nil, ev("t", `{"traceparent":[]}`), detail{1, "metadata", nil, nil}},
		{"MetaSchemaVersionString", "s", nil, ev("t", `{"schema_version":"2"}`), detail{1, "metadata", nil, nil}},
		{"MetaSchemaVersionZero", "s", nil, ev("t", `{"schema_version":0}`), detail{1, "metadata", nil, nil}},
		{"MetaSchemaVersionFraction", "s", nil, ev("t", `{"schema_version":2.5}`), detail{1, "metadata", nil, nil}},
		{"SecondEventBad", "s", nil, `[{"type":"t","data":{}},{"type":"","data":{}}]`, detail{2, "", nil, nil}},
		{"StoredSizeOverLimit", "s", nil, `[{"type":"t","data":` + huge + `}]`, detail{1, "data+metadata", ptr(eventstore.MaxEventBytesLimit), nil}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := b.db.Pool.Exec(ctx, `SELECT * FROM annals.append_events($1, $2, $3::jsonb)`, c.stream, c.expected, c.events)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != eventstore.CodeInvalidEvent {
				t.Fatalf("err = %v, want SQLSTATE %s", err, eventstore.CodeInvalidEvent)
			}
			if c.want.Field == "" {
				return // a check of 0001, whose errors carry no DETAIL
			}
			var got detail
			if err := json.Unmarshal([]byte(pgErr.Detail), &got); err != nil {
				t.Fatalf("DETAIL %q: %v", pgErr.Detail, err)
			}
			if got.Event != c.want.Event || got.Field != c.want.Field || !equalPtr(got.Limit, c.want.Limit) {
				t.Fatalf("DETAIL %s, want event %d, field %s, limit %v (message %q)", pgErr.Detail, c.want.Event, c.want.Field, c.want.Limit, pgErr.Message)
			}
			if c.want.Limit != nil && (got.Actual == nil || *got.Actual <= int64(*c.want.Limit)) {
				t.Fatalf("DETAIL %s: actual not over the limit", pgErr.Detail)
			}
		})
	}

	// What only the server sees comes back to Go typed: an EncodedAppend
	// built by hand skips the Go checks of each event.
	var ie *eventstore.InvalidEventError
	_, err := b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
		return batch.AppendEncoded(eventstore.EncodedAppend{StreamID: "s", Expected: eventstore.Any, Count: 1,
			Events: json.RawMessage(ev(strings.Repeat("t", 300), ""))})
	})
	if !errors.As(err, &ie) || ie.Field != "type" || ie.Limit != eventstore.MaxEventTypeBytes || !strings.Contains(err.Error(), "256") {
		t.Fatalf("AppendEncoded of a type over the limit: %v", err)
	}

	if after := readLogState(t, b); after != before {
		t.Fatalf("bad SQL input changed the log: before %+v, after %+v", before, after)
	}

	// The Go client's appends store the data as sent, so what it measured
	// (MaxEventBytes) is what is stored: append_events expands the numbers
	// past the stored-size limit, Append without group commit
	// (append_events_json, migration 0035) stores the 4.7 KB.
	alone, err := eventstore.New(b.db.Pool, &eventstore.Config{GroupCommit: eventstore.GroupCommit{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := alone.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "t", Data: json.RawMessage(huge)})
	if err != nil {
		t.Fatalf("Append of %d bytes that jsonb spells out past the stored-size limit: %v", len(huge), err)
	}
	var n int
	if err := b.db.Pool.QueryRow(ctx, `SELECT octet_length(data::text) FROM annals.events WHERE global_sequence = $1`, res.Events[0].GlobalSequence).Scan(&n); err != nil || n != len(huge) {
		t.Fatalf("stored %d bytes of data (%v), want the %d sent", n, err, len(huge))
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func ptr(v int) *int { return &v }

func equalPtr(a, b *int) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// CheckStreamID refuses exactly the stream IDs an append refuses, with the
// same *InvalidEventError.
func TestCheckStreamID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	for _, id := range []string{"ok", strings.Repeat("x", eventstore.MaxStreamIDBytes), "é-1",
		"", strings.Repeat("x", eventstore.MaxStreamIDBytes+1), "a\x00b", "a\x7fb", "a\xffb", "   ", "a\u0085b"} {
		checked := eventstore.CheckStreamID(id)
		_, appended := b.store.Append(ctx, id, eventstore.Any, placed("1"))
		var ci, ai *eventstore.InvalidEventError
		errors.As(checked, &ci)
		errors.As(appended, &ai)
		switch {
		case checked == nil && appended != nil:
			t.Errorf("%q: CheckStreamID took it, the append refused it: %v", id, appended)
		case checked != nil && (ci == nil || ai == nil || *ci != *ai):
			t.Errorf("%q: CheckStreamID %v (%+v), the append %v (%+v)", id, checked, ci, appended, ai)
		}
	}
}
