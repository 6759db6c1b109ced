package eventstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/schemaname"
)

type OrderPlaced struct {
	OrderID string `json:"order_id"`
	Total   int    `json:"total"`
}

type OrderShipped struct {
	OrderID string `json:"order_id"`
}

type bundle struct {
	db    *annalstest.DB
	store *eventstore.Store
	reg   *eventstore.Registry
}

func setup(t testing.TB, cfg *eventstore.Config) *bundle {
	t.Helper()
	db := annalstest.NewDB(t, nil)
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[OrderPlaced](reg, "order.placed")
	eventstore.MustRegister[OrderShipped](reg, "order.shipped")
	var c eventstore.Config
	if cfg != nil {
		c = *cfg
	}
	c.Registry = reg
	store, err := eventstore.New(db.Pool, &c)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{db: db, store: store, reg: reg}
}

func collect(t *testing.T, seq func(func(eventstore.Event, error) bool)) ([]eventstore.Event, error) {
	t.Helper()
	var out []eventstore.Event
	for e, err := range seq {
		if err != nil {
			return out, err
		}
		out = append(out, e)
	}
	return out, nil
}

func mustHead(t *testing.T, s *eventstore.Store) int64 {
	t.Helper()
	h, err := s.Head(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestAppendAndRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TypedRoundTrip", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		res, err := b.store.Append(ctx, "order-1", eventstore.NoStream,
			eventstore.EventData{Data: OrderPlaced{OrderID: "1", Total: 100},
				Metadata: eventstore.Metadata{CorrelationID: "corr", CausationID: "cause", Extra: map[string]any{"tenant": "t1"}}},
			eventstore.NewEvent(&OrderShipped{OrderID: "1"}),
		)
		if err != nil {
			t.Fatal(err)
		}
		if res.StreamVersion != 2 || len(res.Events) != 2 || res.Events[0].StreamVersion != 1 ||
			res.Events[1].GlobalSequence != res.Events[0].GlobalSequence+1 {
			t.Fatalf("unexpected result %+v", res)
		}
		events, err := collect(t, b.store.ReadStream(ctx, "order-1", 1))
		if err != nil {
			t.Fatal(err)
		}
		if len(events) != 2 || events[0].Type != "order.placed" || events[1].Type != "order.shipped" {
			t.Fatalf("read back %+v", events)
		}
		if events[0].ID != res.Events[0].ID || events[0].Metadata.CorrelationID != "corr" ||
			events[0].Metadata.CausationID != "cause" || events[0].Metadata.Extra["tenant"] != "t1" {
			t.Fatalf("metadata/ID not kept: %+v", events[0])
		}
		if events[1].Metadata.IsZero() != true {
			t.Fatalf("empty metadata read back as %+v", events[1].Metadata)
		}
		placed, err := eventstore.Decode[OrderPlaced](b.reg, events[0])
		if err != nil {
			t.Fatal(err)
		}
		if placed.Data.Total != 100 || placed.StreamID != "order-1" || placed.StreamVersion != 1 {
			t.Fatalf("decoded %+v", placed)
		}
		if _, err := eventstore.Decode[OrderShipped](b.reg, events[0]); !errors.Is(err, eventstore.ErrUnknownEventType) {
			t.Fatalf("decoding into the wrong type: %v", err)
		}
		anyV, err := b.reg.Decode(events[1])
		if err != nil {
			t.Fatal(err)
		}
		if s, ok := anyV.(OrderShipped); !ok || s.OrderID != "1" {
			t.Fatalf("Registry.Decode = %#v", anyV)
		}
		unknown := events[0]
		unknown.Type = "nope"
		if _, err := b.reg.Decode(unknown); !errors.Is(err, eventstore.ErrUnknownEventType) {
			t.Fatalf("unknown type: %v", err)
		}
	})

	t.Run("RawEventsAndReadAllPaging", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &eventstore.Config{PageSize: 3})
		for i := range 10 {
			if _, err := b.store.Append(ctx, fmt.Sprintf("s-%d", i%3), eventstore.Any,
				eventstore.EventData{Type: "raw.thing", Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}); err != nil {
				t.Fatal(err)
			}
		}
		all, err := collect(t, b.store.ReadAll(ctx, 0))
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 10 {
			t.Fatalf("ReadAll returned %d events, want 10", len(all))
		}
		for i, e := range all {
			if i > 0 && e.GlobalSequence <= all[i-1].GlobalSequence {
				t.Fatalf("positions not increasing at %d", i)
			}
			var d struct{ I int }
			if err := json.Unmarshal(e.Data, &d); err != nil || d.I != i {
				t.Fatalf("event %d data %s", i, e.Data)
			}
		}
		from := all[4].GlobalSequence
		tail, err := collect(t, b.store.ReadAll(ctx, from))
		if err != nil || len(tail) != 6 || tail[0].GlobalSequence != from {
			t.Fatalf("ReadAll(from=%d) = %d events, err %v", from, len(tail), err)
		}
		s0, err := collect(t, b.store.ReadStream(ctx, "s-0", 2))
		if err != nil || len(s0) != 3 || s0[0].StreamVersion != 2 {
			t.Fatalf("ReadStream(s-0, 2) = %+v, %v", s0, err)
		}
		if mustHead(t, b.store) != all[9].GlobalSequence {
			t.Fatal("Head is not the last position")
		}
		n := 0
		for range b.store.ReadAll(ctx, 0) {
			n++
			if n == 4 {
				break
			}
		}
		if n != 4 {
			t.Fatal("breaking out of ReadAll did not stop it")
		}
	})

	t.Run("ReadMissingStream", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		_, err := collect(t, b.store.ReadStream(ctx, "nope", 1))
		if !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("err = %v, want ErrStreamNotFound", err)
		}
		if _, err := b.store.StreamVersion(ctx, "nope"); !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("StreamVersion err = %v", err)
		}
		if _, err := b.store.Append(ctx, "there", eventstore.Any, eventstore.NewEvent(OrderShipped{})); err != nil {
			t.Fatal(err)
		}
		past, err := collect(t, b.store.ReadStream(ctx, "there", 5))
		if err != nil || len(past) != 0 {
			t.Fatalf("reading past the end of an existing stream: %v, %v", past, err)
		}
	})
}

func TestExpectedVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	if _, err := b.store.Append(ctx, "existing", eventstore.NoStream,
		eventstore.NewEvent(OrderShipped{}), eventstore.NewEvent(OrderShipped{})); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		stream   string
		expected eventstore.ExpectedVersion
		ok       bool
		actual   int64
		notFound bool
	}{
		{"AnyOnMissing", "missing-any", eventstore.Any, true, 0, false},
		{"AnyOnExisting", "existing", eventstore.Any, true, 0, false},
		{"NoStreamOnMissing", "missing-nostream", eventstore.NoStream, true, 0, false},
		{"NoStreamOnExisting", "existing", eventstore.NoStream, false, 3, false},
		{"StreamExistsOnMissing", "missing-exists", eventstore.StreamExists, false, 0, true},
		{"StreamExistsOnExisting", "existing", eventstore.StreamExists, true, 0, false},
		{"ExactOnMissing", "missing-exact", eventstore.Exact(1), false, 0, true},
		{"ExactWrong", "existing", eventstore.Exact(1), false, 4, false},
	}
	// Sequential: the cases on "existing" build on each other's versions.
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			head := mustHead(t, b.store)
			_, err := b.store.Append(ctx, c.stream, c.expected, eventstore.NewEvent(OrderShipped{}))
			if c.ok {
				if err != nil {
					t.Fatalf("append: %v", err)
				}
				return
			}
			var wev *eventstore.WrongExpectedVersionError
			if !errors.Is(err, eventstore.ErrWrongExpectedVersion) || !errors.As(err, &wev) {
				t.Fatalf("err = %v, want ErrWrongExpectedVersion", err)
			}
			if wev.Actual != c.actual || wev.StreamID != c.stream || wev.Expected != c.expected {
				t.Fatalf("error carries %+v, want actual %d", wev, c.actual)
			}
			if got := errors.Is(err, eventstore.ErrStreamNotFound); got != c.notFound {
				t.Fatalf("errors.Is(err, ErrStreamNotFound) = %v, want %v", got, c.notFound)
			}
			if mustHead(t, b.store) != head {
				t.Fatal("a failed append wrote something")
			}
		})
	}
	t.Run("ExactRight", func(t *testing.T) {
		v, err := b.store.StreamVersion(ctx, "existing")
		if err != nil {
			t.Fatal(err)
		}
		res, err := b.store.Append(ctx, "existing", eventstore.Exact(v), eventstore.NewEvent(OrderShipped{}))
		if err != nil || res.StreamVersion != v+1 {
			t.Fatalf("append at exact version %d: %+v, %v", v, res, err)
		}
	})
}

// Many appends race for the same expected version: exactly one wins, every
// loser learns the actual version.
func TestConcurrentAppendsSameExpectedVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	if _, err := b.store.Append(ctx, "contended", eventstore.NoStream, eventstore.NewEvent(OrderShipped{})); err != nil {
		t.Fatal(err)
	}
	const racers = 8
	var wg sync.WaitGroup
	errs := make([]error, racers)
	start := make(chan struct{})
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = b.store.Append(ctx, "contended", eventstore.Exact(1), eventstore.NewEvent(OrderShipped{OrderID: fmt.Sprint(i)}))
		}()
	}
	close(start)
	wg.Wait()
	wins := 0
	for _, err := range errs {
		var wev *eventstore.WrongExpectedVersionError
		switch {
		case err == nil:
			wins++
		case errors.As(err, &wev) && wev.Actual == 2:
		default:
			t.Errorf("unexpected error %v", err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d appends won, want exactly 1", wins)
	}
	if v, _ := b.store.StreamVersion(ctx, "contended"); v != 2 {
		t.Fatalf("stream version %d, want 2", v)
	}
}

func TestIdempotentReappend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	ids := []uuid.UUID{uuid.New(), uuid.New()}
	events := []eventstore.EventData{
		{ID: ids[0], Data: OrderPlaced{OrderID: "9", Total: 1}},
		{ID: ids[1], Data: OrderShipped{OrderID: "9"}},
	}
	first, err := b.store.Append(ctx, "order-9", eventstore.NoStream, events...)
	if err != nil {
		t.Fatal(err)
	}
	head := mustHead(t, b.store)
	// The retry carries the same (now stale) expected version: still a no-op success.
	again, err := b.store.Append(ctx, "order-9", eventstore.NoStream, events...)
	if err != nil {
		t.Fatalf("re-append: %v", err)
	}
	if fmt.Sprint(again.Events) != fmt.Sprint(first.Events) || again.StreamVersion != first.StreamVersion {
		t.Fatalf("re-append returned %+v, first append %+v", again, first)
	}
	if mustHead(t, b.store) != head {
		t.Fatal("re-append wrote events")
	}
	// Same ID, different data: a conflict, not a silent no-op.
	_, err = b.store.Append(ctx, "order-9", eventstore.Any, eventstore.EventData{ID: ids[0], Data: OrderPlaced{OrderID: "9", Total: 2}})
	if !errors.Is(err, eventstore.ErrEventIDConflict) {
		t.Fatalf("changed data under a stored ID: %v", err)
	}
	// Same ID in another stream.
	_, err = b.store.Append(ctx, "order-10", eventstore.Any, events[0])
	if !errors.Is(err, eventstore.ErrEventIDConflict) {
		t.Fatalf("stored ID in another stream: %v", err)
	}
	// Partly stored.
	_, err = b.store.Append(ctx, "order-9", eventstore.Any, events[0], eventstore.NewEvent(OrderShipped{}))
	if !errors.Is(err, eventstore.ErrEventIDConflict) {
		t.Fatalf("partly stored append: %v", err)
	}
	if mustHead(t, b.store) != head {
		t.Fatal("a rejected append wrote events")
	}
}

// One event alone takes the direct look-up of its ID (append_batch's
// one-event probe): the same outcomes as an append of several.
func TestIdempotentReappendOneEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	ev := eventstore.EventData{ID: uuid.New(), Data: OrderPlaced{OrderID: "11", Total: 1}}
	first, err := b.store.Append(ctx, "order-11", eventstore.NoStream, ev)
	if err != nil {
		t.Fatal(err)
	}
	head := mustHead(t, b.store)
	again, err := b.store.Append(ctx, "order-11", eventstore.NoStream, ev)
	if err != nil || fmt.Sprint(again.Events) != fmt.Sprint(first.Events) || again.StreamVersion != first.StreamVersion {
		t.Fatalf("re-append returned %+v (%v), first append %+v", again, err, first)
	}
	for name, other := range map[string]struct {
		stream string
		ev     eventstore.EventData
	}{
		"OtherData":   {"order-11", eventstore.EventData{ID: ev.ID, Data: OrderPlaced{OrderID: "11", Total: 2}}},
		"OtherType":   {"order-11", eventstore.EventData{ID: ev.ID, Data: OrderShipped{OrderID: "11"}}},
		"OtherStream": {"order-12", ev},
	} {
		if _, err := b.store.Append(ctx, other.stream, eventstore.Any, other.ev); !errors.Is(err, eventstore.ErrEventIDConflict) {
			t.Fatalf("%s: %v, want ErrEventIDConflict", name, err)
		}
	}
	if mustHead(t, b.store) != head {
		t.Fatal("re-appends wrote events")
	}
}

func TestAppendOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	if _, err := b.store.Append(ctx, "s", eventstore.Any, eventstore.NewEvent(OrderShipped{OrderID: "x"})); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`UPDATE annals.events SET event_type = 'changed'`,
		`DELETE FROM annals.events`,
		`TRUNCATE annals.events`,
	} {
		_, err := b.db.Pool.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != eventstore.CodeAppendOnly || !strings.Contains(pgErr.Message, "append-only") {
			t.Fatalf("%s: err = %v, want SQLSTATE %s", stmt, err, eventstore.CodeAppendOnly)
		}
	}
	events, err := collect(t, b.store.ReadStream(ctx, "s", 1))
	if err != nil || len(events) != 1 || events[0].Type != "order.shipped" {
		t.Fatalf("event changed: %+v, %v", events, err)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &eventstore.Config{MaxEventBytes: 1024})
	ok := eventstore.NewEvent(OrderShipped{})
	type unregistered struct{ A int }
	dup := uuid.New()
	cases := []struct {
		name     string
		stream   string
		expected eventstore.ExpectedVersion
		events   []eventstore.EventData
		want     error
	}{
		{"EmptyStreamID", "", eventstore.Any, []eventstore.EventData{ok}, eventstore.ErrInvalidEvent},
		{"NoEvents", "s", eventstore.Any, nil, eventstore.ErrInvalidEvent},
		{"BadExpectedVersion", "s", eventstore.ExpectedVersion(-7), []eventstore.EventData{ok}, eventstore.ErrInvalidEvent},
		{"EmptyTypeRawData", "s", eventstore.Any, []eventstore.EventData{{Data: json.RawMessage(`{}`)}}, eventstore.ErrUnknownEventType},
		{"UnregisteredGoType", "s", eventstore.Any, []eventstore.EventData{{Data: unregistered{1}}}, eventstore.ErrUnknownEventType},
		{"NilData", "s", eventstore.Any, []eventstore.EventData{{Type: "t"}}, eventstore.ErrInvalidEvent},
		{"DataScalar", "s", eventstore.Any, []eventstore.EventData{{Type: "t", Data: 5}}, eventstore.ErrInvalidEvent},
		{"DataString", "s", eventstore.Any, []eventstore.EventData{{Type: "t", Data: "text"}}, eventstore.ErrInvalidEvent},
		{"DataInvalidJSON", "s", eventstore.Any, []eventstore.EventData{{Type: "t", Data: json.RawMessage(`{"a":`)}}, eventstore.ErrInvalidEvent},
		{"DataUnencodable", "s", eventstore.Any, []eventstore.EventData{{Type: "t", Data: map[string]any{"f": func() {}}}}, eventstore.ErrInvalidEvent},
		{"Oversized", "s", eventstore.Any, []eventstore.EventData{{Type: "t", Data: map[string]string{"a": strings.Repeat("x", 1100)}}}, eventstore.ErrInvalidEvent},
		{"TypeMismatchesRegistry", "s", eventstore.Any, []eventstore.EventData{{Type: "order.placed", Data: OrderShipped{}}}, eventstore.ErrInvalidEvent},
		{"DuplicateIDInOneAppend", "s", eventstore.Any, []eventstore.EventData{{ID: dup, Data: OrderShipped{}}, {ID: dup, Data: OrderShipped{}}}, eventstore.ErrInvalidEvent},
		{"SecondEventBad", "s", eventstore.Any, []eventstore.EventData{ok, {Type: "t", Data: 1}}, eventstore.ErrInvalidEvent},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := b.store.Append(ctx, c.stream, c.expected, c.events...)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			_, err = b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
				return batch.Append(c.stream, c.expected, c.events...)
			})
			if !errors.Is(err, c.want) {
				t.Fatalf("Transact err = %v, want %v", err, c.want)
			}
		})
	}
	if h := mustHead(t, b.store); h != 0 {
		t.Fatalf("bad input wrote events: head %d", h)
	}
	var streams int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.streams`).Scan(&streams); err != nil || streams != 0 {
		t.Fatalf("bad input created %d streams (%v)", streams, err)
	}
}

// The SQL function is public API: producers in other languages get the same
// checks, reported with documented SQLSTATEs.
func TestSQLFunctionRejectsBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	cases := []struct {
		name, stream string
		expected     any
		events       string
		code         string
	}{
		{"EmptyStream", "", nil, `[{"type":"t","data":{}}]`, eventstore.CodeInvalidEvent},
		{"NullStream", "\x00null", nil, `[{"type":"t","data":{}}]`, eventstore.CodeInvalidEvent},
		{"NotArray", "s", nil, `{"type":"t","data":{}}`, eventstore.CodeInvalidEvent},
		{"EmptyArray", "s", nil, `[]`, eventstore.CodeInvalidEvent},
		{"ElementNotObject", "s", nil, `[1]`, eventstore.CodeInvalidEvent},
		{"MissingType", "s", nil, `[{"data":{}}]`, eventstore.CodeInvalidEvent},
		{"EmptyType", "s", nil, `[{"type":"","data":{}}]`, eventstore.CodeInvalidEvent},
		{"TypeNotString", "s", nil, `[{"type":3,"data":{}}]`, eventstore.CodeInvalidEvent},
		{"MissingData", "s", nil, `[{"type":"t"}]`, eventstore.CodeInvalidEvent},
		{"ScalarData", "s", nil, `[{"type":"t","data":"x"}]`, eventstore.CodeInvalidEvent},
		{"MetadataNotObject", "s", nil, `[{"type":"t","data":{},"metadata":[1]}]`, eventstore.CodeInvalidEvent},
		{"BadEventID", "s", nil, `[{"type":"t","data":{},"event_id":"nope"}]`, eventstore.CodeInvalidEvent},
		{"UnknownKey", "s", nil, `[{"type":"t","data":{},"evnet_id":"x"}]`, eventstore.CodeInvalidEvent},
		{"DuplicateIDs", "s", nil, `[{"type":"t","data":{},"event_id":"00000000-0000-0000-0000-000000000001"},{"type":"t","data":{},"event_id":"00000000-0000-0000-0000-000000000001"}]`, eventstore.CodeInvalidEvent},
		{"BadExpected", "s", int64(-5), `[{"type":"t","data":{}}]`, eventstore.CodeInvalidEvent},
		{"WrongExpected", "s", int64(3), `[{"type":"t","data":{}}]`, eventstore.CodeWrongExpectedVersion},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stream any = c.stream
			if c.stream == "\x00null" {
				stream = nil
			}
			_, err := b.db.Pool.Exec(ctx, `SELECT * FROM annals.append_events($1, $2, $3::jsonb)`, stream, c.expected, c.events)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != c.code {
				t.Fatalf("err = %v, want SQLSTATE %s", err, c.code)
			}
		})
	}
	if h := mustHead(t, b.store); h != 0 {
		t.Fatalf("bad SQL input wrote events: head %d", h)
	}
	// A SQL producer without event IDs gets generated ones.
	var id uuid.UUID
	var pos, ver int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT * FROM annals.append_events('sql', 0, '[{"type":"t","data":{"a":1}}]')`).Scan(&id, &pos, &ver); err != nil {
		t.Fatal(err)
	}
	if id == uuid.Nil || pos != 1 || ver != 1 {
		t.Fatalf("SQL append returned %v %d %d", id, pos, ver)
	}
}

func TestTransact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	setupSide := func(t *testing.T) *bundle {
		b := setup(t, nil)
		if _, err := b.db.Pool.Exec(ctx, `CREATE TABLE side (id text PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		return b
	}
	count := func(t *testing.T, b *bundle) (side int, head int64) {
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM side`).Scan(&side); err != nil {
			t.Fatal(err)
		}
		return side, mustHead(t, b.store)
	}

	t.Run("WorkThenAppendsCommitTogether", func(t *testing.T) {
		t.Parallel()
		b := setupSide(t)
		res, err := b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
			if _, err := tx.Exec(ctx, `INSERT INTO side VALUES ('a')`); err != nil {
				return err
			}
			if err := batch.Append("one", eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "1"})); err != nil {
				return err
			}
			return batch.Append("two", eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "2"}), eventstore.NewEvent(OrderShipped{OrderID: "2"}))
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 2 || res[0].StreamID != "one" || res[1].StreamVersion != 2 ||
			res[1].Events[0].GlobalSequence != res[0].Events[0].GlobalSequence+1 {
			t.Fatalf("results %+v", res)
		}
		if side, head := count(t, b); side != 1 || head != 3 {
			t.Fatalf("side rows %d, head %d", side, head)
		}
		// The connection went back to the pool idle and usable.
		if _, err := b.store.Append(ctx, "one", eventstore.Exact(1), eventstore.NewEvent(OrderShipped{})); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("BodyErrorRollsBack", func(t *testing.T) {
		t.Parallel()
		b := setupSide(t)
		boom := errors.New("boom")
		_, err := b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
			if _, err := tx.Exec(ctx, `INSERT INTO side VALUES ('a')`); err != nil {
				return err
			}
			if err := batch.Append("one", eventstore.Any, eventstore.NewEvent(OrderShipped{})); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v", err)
		}
		if side, head := count(t, b); side != 0 || head != 0 {
			t.Fatalf("side rows %d, head %d after a failed body", side, head)
		}
	})

	t.Run("FailedAppendRollsBackTheWork", func(t *testing.T) {
		t.Parallel()
		b := setupSide(t)
		if _, err := b.store.Append(ctx, "taken", eventstore.Any, eventstore.NewEvent(OrderShipped{})); err != nil {
			t.Fatal(err)
		}
		_, err := b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
			if _, err := tx.Exec(ctx, `INSERT INTO side VALUES ('a')`); err != nil {
				return err
			}
			if err := batch.Append("fresh", eventstore.NoStream, eventstore.NewEvent(OrderShipped{})); err != nil {
				return err
			}
			return batch.Append("taken", eventstore.NoStream, eventstore.NewEvent(OrderShipped{}))
		})
		var wev *eventstore.WrongExpectedVersionError
		if !errors.As(err, &wev) || wev.StreamID != "taken" || wev.Actual != 1 {
			t.Fatalf("err = %v", err)
		}
		if side, head := count(t, b); side != 0 || head != 1 {
			t.Fatalf("side rows %d, head %d: the failed transaction left something", side, head)
		}
		if _, err := b.store.StreamVersion(ctx, "fresh"); !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("stream of the rolled-back batch exists: %v", err)
		}
	})

	t.Run("BodyMustNotCommit", func(t *testing.T) {
		t.Parallel()
		b := setupSide(t)
		_, err := b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
			if err := batch.Append("x", eventstore.Any, eventstore.NewEvent(OrderShipped{})); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "COMMIT")
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "must not commit") {
			t.Fatalf("err = %v", err)
		}
		if _, head := count(t, b); head != 0 {
			t.Fatal("events appended after the body committed")
		}
	})

	t.Run("AppendTxInCallersTransaction", func(t *testing.T) {
		t.Parallel()
		b := setupSide(t)
		tx, err := b.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.AppendTx(ctx, tx, "in-tx", eventstore.NoStream, eventstore.NewEvent(OrderShipped{})); err != nil {
			t.Fatal(err)
		}
		if _, head := count(t, b); head != 0 {
			t.Fatal("uncommitted append visible")
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.StreamVersion(ctx, "in-tx"); !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("rolled-back append kept: %v", err)
		}
	})
}

// The append lock key computed in Go is the md5 halves that SQL computes:
// other tools (and operators reading pg_locks) can derive it.
func TestAppendLockKeyMatchesSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	k1, k2 := schemaname.AppendLockKey("annals")
	var s1, s2 int32
	err := b.db.Pool.QueryRow(context.Background(),
		`SELECT ('x' || substr(md5($1), 1, 8))::bit(32)::int4, ('x' || substr(md5($1), 9, 8))::bit(32)::int4`,
		"annals:append").Scan(&s1, &s2)
	if err != nil {
		t.Fatal(err)
	}
	if s1 != k1 || s2 != k2 {
		t.Fatalf("Go key (%d,%d) != SQL key (%d,%d)", k1, k2, s1, s2)
	}
}

// Each append announces the new head on the schema's channel at commit, so
// subscribers can wake up instead of polling.
func TestAppendNotifies(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"annals", `Other "Schema"`} {
		t.Run(schema, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			db := annalstest.NewDB(t, &annalstest.Options{Schema: schema})
			store, err := eventstore.New(db.Pool, &eventstore.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.Connect(ctx, db.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{schemaname.Channel(schema)}.Sanitize()); err != nil {
				t.Fatal(err)
			}
			res, err := store.Append(ctx, "s", eventstore.Any,
				eventstore.EventData{Type: "t", Data: json.RawMessage(`{}`)}, eventstore.EventData{Type: "t", Data: json.RawMessage(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprint(res.Events[1].GlobalSequence); n.Payload != want || n.Channel != schemaname.Channel(schema) {
				t.Fatalf("notification %q on %q, want %q on %q", n.Payload, n.Channel, want, schemaname.Channel(schema))
			}
			// A rolled-back append announces nothing.
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.AppendTx(ctx, tx, "s", eventstore.Any, eventstore.EventData{Type: "t", Data: json.RawMessage(`{}`)}); err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			res, err = store.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "t", Data: json.RawMessage(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			if n, err = conn.WaitForNotification(ctx); err != nil || n.Payload != fmt.Sprint(res.Events[0].GlobalSequence) {
				t.Fatalf("after a rollback got %v, %v; want the next commit's head %d", n, err, res.Events[0].GlobalSequence)
			}
		})
	}
}

// Under REPEATABLE READ, an append whose snapshot predates a concurrent
// append that created the same stream fails with a serialization failure
// (40001, documented in docs/sql-api.md), and writes nothing.
func TestAppendUnderRepeatableReadRacesToSerializationFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	for _, expected := range []eventstore.ExpectedVersion{eventstore.Any, eventstore.NoStream} {
		stream := "rr-" + expected.String()
		tx, err := b.db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		var one int
		if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil { // take the snapshot
			t.Fatal(err)
		}
		if _, err := b.store.Append(ctx, stream, eventstore.NoStream, eventstore.NewEvent(OrderShipped{})); err != nil {
			t.Fatal(err)
		}
		_, err = b.store.AppendTx(ctx, tx, stream, expected, eventstore.NewEvent(OrderShipped{}))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
			t.Fatalf("expected %s: err = %v, want SQLSTATE 40001", expected, err)
		}
		_ = tx.Rollback(ctx)
		if v, err := b.store.StreamVersion(ctx, stream); err != nil || v != 1 {
			t.Fatalf("stream %s at version %d (%v), want 1", stream, v, err)
		}
	}
}

func TestEncodedAppend(t *testing.T) {
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Encode(ctx, "", eventstore.Any, eventstore.EventData{Type: "x", Data: map[string]int{}}); !errors.Is(err, eventstore.ErrInvalidEvent) {
		t.Fatalf("empty stream: %v", err)
	}
	enc, err := store.Encode(ctx, "s-1", eventstore.NoStream,
		eventstore.EventData{Type: "a", Data: map[string]int{"n": 1}}, eventstore.EventData{Type: "b", Data: map[string]int{"n": 2}})
	if err != nil {
		t.Fatal(err)
	}
	// It survives a JSON round trip (a timer row stores it), and appending it
	// twice appends once.
	b, err := json.Marshal(enc)
	if err != nil {
		t.Fatal(err)
	}
	var back eventstore.EncodedAppend
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	back.Expected = eventstore.Any // the second append must not fail on NoStream: idempotency decides
	for range 2 {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := store.AppendEncodedTx(ctx, tx, back)
		if err != nil {
			t.Fatal(err)
		}
		if res.StreamVersion != 2 || len(res.Events) != 2 {
			t.Fatalf("result %+v", res)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := store.StreamVersion(ctx, "s-1"); err != nil || v != 2 {
		t.Fatalf("stream version %d, %v; want 2", v, err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := store.AppendEncodedTx(ctx, tx, eventstore.EncodedAppend{StreamID: "s-1"}); !errors.Is(err, eventstore.ErrInvalidEvent) {
		t.Fatalf("malformed encoded append: %v", err)
	}

	// Staged in Transact: the body's work, then the appends and the commit
	// in one round trip; a re-append is a no-op there too, and a malformed
	// one is refused when staged.
	enc2, err := store.Encode(ctx, "s-2", eventstore.NoStream, eventstore.EventData{Type: "c", Data: map[string]int{"n": 3}})
	if err != nil {
		t.Fatal(err)
	}
	results, err := store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		if err := b.AppendEncoded(eventstore.EncodedAppend{StreamID: "s-2", Count: 1, Events: []byte("[")}); !errors.Is(err, eventstore.ErrInvalidEvent) {
			t.Errorf("staging a malformed encoded append: %v", err)
		}
		if err := b.AppendEncoded(back); err != nil {
			return err
		}
		return b.AppendEncoded(enc2)
	})
	if err != nil || len(results) != 2 || results[0].StreamVersion != 2 || results[1].StreamVersion != 1 {
		t.Fatalf("Transact with encoded appends = %+v, %v", results, err)
	}
	if v, err := store.StreamVersion(ctx, "s-2"); err != nil || v != 1 {
		t.Fatalf("stream s-2 version %d, %v; want 1", v, err)
	}
	// A failing staged append rolls the whole transaction back.
	enc3, err := store.Encode(ctx, "s-2", eventstore.NoStream, eventstore.EventData{Type: "c", Data: map[string]int{"n": 4}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE encoded_marker ()`); err != nil {
			return err
		}
		return b.AppendEncoded(enc3) // NoStream, but s-2 exists now
	}); !errors.Is(err, eventstore.ErrWrongExpectedVersion) {
		t.Fatalf("failing encoded append in Transact: %v", err)
	}
	var marker *string
	if err := db.Pool.QueryRow(ctx, `SELECT to_regclass('encoded_marker')::text`).Scan(&marker); err != nil || marker != nil {
		t.Fatalf("the failed Transact kept its work: %v, %v", marker, err)
	}
}
