package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// A timer keeps its encoded append byte for byte (in timers.payload_json,
// json, since migration 0033; the jsonb column payload rewrote it: keys
// sorted, a duplicate key dropped, 1e2 spelled 100), and its payload is not compacted or
// HTML-escaped on the way (json.Marshal did both). When it fires, the
// append is sent as stored, and its event's data is the bytes scheduled
// (append_events_json, migration 0035; append_events stored jsonb's
// rendering), as the same event appended by Transact.
func TestTimerPayloadKeptByteForByte(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})
	ctx := t.Context()
	raw := json.RawMessage(`{"zeta": 1, "a":  2.50, "dup": 1, "dup": 2, "e": 1e2, "html": "<b> & </b>"}`)
	e := eventstore.EventData{ID: uuid.New(), Type: "raw", Data: raw}
	enc, err := s.store.Encode(ctx, "timer", eventstore.Any, e)
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.Schedule(ctx, nil, t0, "timer", e)
	if err != nil {
		t.Fatal(err)
	}
	var payload []byte
	if err := db.Pool.QueryRow(ctx, `SELECT payload_json::text FROM annals.timers WHERE id = $1 AND payload IS NULL`, id).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	var stored eventstore.EncodedAppend
	if err := json.Unmarshal(payload, &stored); err != nil {
		t.Fatal(err)
	}
	if string(stored.Events) != string(enc.Events) || !strings.Contains(string(payload), string(raw)) {
		t.Fatalf("stored events\n%s\nwant, as encoded,\n%s", stored.Events, enc.Events)
	}
	if stored.StreamID != "timer" || stored.Expected != eventstore.Any || stored.Count != 1 {
		t.Errorf("stored append %+v", stored)
	}
	if ts, err := s.Timers(ctx, 10); err != nil || len(ts) != 1 || ts[0].Events != 1 || ts[0].EventType != "raw" {
		t.Errorf("Timers = %+v, %v; want the timer with 1 event of type raw", ts, err)
	}

	if n := fireDue(t, s); n != 1 {
		t.Fatalf("FireDue fired %d, want 1", n)
	}
	if _, err := s.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		return b.Append("direct", eventstore.Any, eventstore.EventData{Type: "raw", Data: raw})
	}); err != nil {
		t.Fatal(err)
	}
	var fired, direct string
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT data::text FROM annals.events WHERE stream_id = 'timer'),
		(SELECT data::text FROM annals.events WHERE stream_id = 'direct')`).Scan(&fired, &direct); err != nil {
		t.Fatal(err)
	}
	if fired != string(raw) || direct != string(raw) {
		t.Errorf("the timer's event holds %s and the same data appended by Transact %s; want the bytes scheduled, %s", fired, direct, raw)
	}
	// Firing it again (the same encoded append) is a no-op by event ID.
	if _, err := s.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		return b.AppendEncoded(stored)
	}); err != nil || eventsIn(t, db, "timer") != 1 {
		t.Errorf("re-appending the stored append: %v, %d events", err, eventsIn(t, db, "timer"))
	}
}

// hugeNumbers is the data of the finding: 100 keys of 1e131000, which
// jsonb holds (numeric takes 131072 digits before the point) and spells
// out, 131,001 bytes each.
func hugeNumbers() json.RawMessage {
	parts := make([]string, 100)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"k%d":1e131000`, i)
	}
	return json.RawMessage("{" + strings.Join(parts, ",") + "}")
}

// A timer whose event is 1.5 KB as encoded is 1.5 KB as stored (as jsonb
// it was stored, and sent when it fired, as 13 MB, past MaxEventBytes).
// And when it fires the append is measured again: a timer whose payload is
// over MaxEventBytes by then (a row stored before migration 0033 keeps its
// jsonb payload, in jsonb's spelling, which the UPDATE below reproduces) fails for good
// with an *InvalidEventError naming the limit, and appends nothing.
func TestTimerPayloadSizeKeptAndCheckedWhenFired(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})
	ctx := t.Context()
	data := hugeNumbers()
	id, err := s.Schedule(ctx, nil, t0, "huge", eventstore.EventData{Type: "x", Data: data})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT octet_length(payload_json::text) FROM annals.timers WHERE id = $1`, id); n > len(data)+200 {
		t.Fatalf("the timer's payload is %d bytes for %d bytes of data", n, len(data))
	}

	if _, err := db.Pool.Exec(ctx, `UPDATE annals.timers SET payload = payload_json::jsonb, payload_json = NULL WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if n := fireDue(t, s); n != 0 {
		t.Fatalf("FireDue fired %d, want 0", n)
	}
	if got := eventsIn(t, db, "huge"); got != 0 {
		t.Fatalf("%d events appended from a payload over MaxEventBytes", got)
	}
	ts, err := s.Timers(ctx, 10)
	if err != nil || len(ts) != 1 {
		t.Fatalf("Timers = %+v, %v", ts, err)
	}
	if !ts[0].Failed() || ts[0].Attempts != 1 || !strings.Contains(ts[0].LastError, "data+metadata") ||
		!strings.Contains(ts[0].LastError, fmt.Sprintf("the limit is %d", eventstore.DefaultMaxEventBytes)) {
		t.Errorf("timer %+v; want failed for good after 1 attempt, over the limit", ts[0])
	}
}

// A number that jsonb cannot hold (beyond numeric's range: an exponent too
// large or too small, or more than 16383 digits after the point) in
// metadata or in data holding "$personal" (personal data) or a \u escape,
// which the append refuses, fails Schedule with ErrInvalidTimer and an
// *eventstore.InvalidEventError naming the event and the field, and stores
// nothing: the timer could never fire. It failed with a bare SQLSTATE 22003
// from the jsonb column. In the caller's transaction, the transaction goes
// on. Numbers jsonb holds, however long their exponent, such text in
// strings, and any number in other data (which append_events_json stores
// as written, as Append and Transact do since migration 0035) are
// scheduled, and the last fire with the data as scheduled.
func TestTimerNumberJsonbCannotHold(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	s := newScheduler(t, db, nil)
	ctx := t.Context()
	at := t0.Add(time.Hour)
	for _, c := range []struct {
		name  string
		event eventstore.EventData
		field string
	}{
		{"HugeExponent", ev("x", json.RawMessage(`{"email":{"$personal":{}},"n":1e200000}`)), "data"},
		{"TinyExponent", ev("x", json.RawMessage(`{"email":{"$personal":{}},"n":-0.0e-999999}`)), "data"},
		{"LongFraction", ev("x", json.RawMessage(`[{"$personal":{}},0.`+strings.Repeat("1", 16384)+`]`)), "data"},
		{"WithEscape", ev("x", json.RawMessage(`{"s":"\u00e9","n":1e200000}`)), "data"},
		{"InMetadata", eventstore.EventData{Type: "x", Data: map[string]int{},
			Metadata: eventstore.Metadata{Extra: map[string]any{"n": json.RawMessage(`1e200000`)}}}, "metadata"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, inTx := range []bool{false, true} {
				var tx pgx.Tx
				if inTx {
					var err error
					if tx, err = db.Pool.Begin(ctx); err != nil {
						t.Fatal(err)
					}
					defer tx.Rollback(ctx) //nolint:errcheck // after the commit below, a no-op
				}
				_, err := s.Schedule(ctx, tx, at, "s", ev("ok", map[string]int{}), c.event)
				var ie *eventstore.InvalidEventError
				if !errors.Is(err, ErrInvalidTimer) || !errors.Is(err, eventstore.ErrInvalidEvent) || !errors.As(err, &ie) ||
					ie.Event != 2 || ie.Field != c.field {
					t.Fatalf("in a tx %v: Schedule = %v; want ErrInvalidTimer and an *InvalidEventError for event 2, %s", inTx, err, c.field)
				}
				if inTx {
					if _, err := s.Schedule(ctx, tx, at, "s", ev("ok", map[string]int{})); err != nil {
						t.Fatalf("the caller's transaction after the refusal: %v", err)
					}
					if err := tx.Commit(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
	if n := timerRows(t, db); n != 5 {
		t.Fatalf("%d timers stored; want the 5 scheduled after a refusal in a transaction", n)
	}
	for _, data := range []string{`{"n":1e99999}`, `{"n":1e-00009}`, `{"s":"1e200000", "t":"\"1e200000"}`, `[1.` + strings.Repeat("5", 16000) + `]`} {
		if _, err := s.Schedule(ctx, nil, at, "s", ev("x", json.RawMessage(data))); err != nil {
			t.Errorf("Schedule of %.40s: %v", data, err)
		}
	}

	clock := newFakeClock(t0)
	fires := newScheduler(t, db, &Config{Clock: clock})
	for i, data := range []string{`{"n":1e200000}`, `{"n":-0.0e-999999}`, `[0.` + strings.Repeat("1", 16384) + `]`} {
		stream := fmt.Sprintf("other-%d", i)
		if _, err := fires.Schedule(ctx, nil, t0, stream, ev("x", json.RawMessage(data))); err != nil {
			t.Fatalf("Schedule of %.40s: %v", data, err)
		}
		if n := fireDue(t, fires); n != 1 {
			t.Fatalf("FireDue of %.40s fired %d, want 1", data, n)
		}
		var stored string
		if err := db.Pool.QueryRow(ctx, `SELECT data::text FROM annals.events WHERE stream_id = $1`, stream).Scan(&stored); err != nil || stored != data {
			t.Fatalf("the fired event of %.40s holds %.40s (%v), want the data as scheduled", data, stored, err)
		}
	}
}

func TestMayOverflowNumeric(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		json string
		may  bool
	}{
		{`{"n":1}`, false},
		{`{"n":1e9999,"m":-1.5E-9999}`, false},
		{`{"n":1e10000}`, true},
		{`{"n":1E+00001}`, true}, // leading zeros count: only PostgreSQL knows
		{`[true,false,null,"e12345"]`, false},
		{`{"s":"1e99999","t":"\\","u":"\"1e99999"}`, false},
		{`{"s":"\\"}` + `1e99999`, true},
		{`[` + strings.Repeat("1", maxSafeNumberBytes) + `]`, false},
		{`[-` + strings.Repeat("1", maxSafeNumberBytes) + `]`, true},
		{`{"e12345":0}`, false},
	} {
		if got := mayOverflowNumeric([]byte(c.json)); got != c.may {
			t.Errorf("mayOverflowNumeric(%.60s) = %v, want %v", c.json, got, c.may)
		}
	}
}
