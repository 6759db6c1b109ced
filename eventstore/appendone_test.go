package eventstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/eventstore"
)

// appendOneOp is one step of TestAppendOneMatchesAppendBatch: an append of
// one event (or, with pre, a stream deletion before it).
type appendOneOp struct {
	pre      string // "", "delete" or "tombstone": delete_stream first
	stream   string // "": the function's own stream; else this (bad) ID
	expected string // "any", "-2", "-1", "0", "cur", "cur+1", "cur-1", "max"
	reuse    int    // -1: a new event ID; k: the ID of step k (a re-append); -2: an ID stored in another stream
	typ      string
	data     string
	meta     *string
	check    bool
	null     string // "", or the argument sent as NULL: "stream", "id", "type", "data" or "check"
	clean    bool   // with null: nothing else is wrong
}

// appendOneOutcome is what one function answered for one step.
type appendOneOutcome struct {
	code, detail   string // SQLSTATE and DETAIL of an error
	status         int16
	version, actua *int64
	wrote          bool // a position came back
}

func (o appendOneOutcome) String() string {
	v := func(p *int64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	}
	if o.code != "" {
		return fmt.Sprintf("error %s %s", o.code, o.detail)
	}
	return fmt.Sprintf("status %d version %s actual %s position %v", o.status, v(o.version), v(o.actua), o.wrote)
}

// TestAppendOneMatchesAppendBatch runs random sequences of single-event
// appends against two streams, one through append_one and one through
// append_batch with one append of one event, and requires the same answer
// at every step: the same error (SQLSTATE and DETAIL) for bad input, the
// same status, stream version and actual version otherwise. The steps mix
// good and bad input (NULL for each argument too), every kind of expected
// version, re-appends of earlier event IDs (same content or another type),
// and soft and hard deletions of the stream, so every branch of append_one
// meets its append_batch twin.
func TestAppendOneMatchesAppendBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(13, 2026))
	// Good values first, then bad ones, which pick draws one time in ten.
	metas := []*string{nil, newp(""), newp("{}"), newp(`{"correlation_id": "c-1"}`),
		newp(`{"correlation_id": 1}`), newp("[]"), newp(`{"a": "\u0000"}`), newp("{nope")}
	// Bad stream IDs, the same for both functions (nothing is written).
	badStreams := []string{"", " ", strings.Repeat("s", 513), "a\x01b"}
	types := []string{"t", "u", "", " ", "$stream.deleted", strings.Repeat("x", 257), "a\x01b"}
	datas := []string{`{"a": 1}`, `[1, 2]`, ` {"b": 2}`, "42", "{nope", `{"a": "\u0000"}`, `{"a": "\ud800"}`}
	expecteds := []string{"any", "-1", "0", "cur", "cur", "cur+1", "cur-1", "-2", "max"}
	pick := func(good, all int) int {
		if rng.IntN(10) == 0 {
			return rng.IntN(all)
		}
		return rng.IntN(good)
	}

	// An event of each function's in a stream of its own, whose ID a step
	// may re-append to the sequence's stream (status 2: another stream).
	foreign := map[string]uuid.UUID{"one": uuid.New(), "batch": uuid.New()}
	for fn, id := range foreign {
		if _, err := b.db.Pool.Exec(ctx, `SELECT * FROM annals.append_events($1, NULL, $2)`, "foreign-"+fn,
			fmt.Sprintf(`[{"event_id": %q, "type": "t", "data": {"a": 1}}]`, id)); err != nil {
			t.Fatal(err)
		}
	}
	run := func(fn, stream string, op appendOneOp, ids []uuid.UUID, cur int64) appendOneOutcome {
		t.Helper()
		switch op.pre {
		case "delete", "tombstone":
			// Either may be refused (a new or tombstoned stream): what
			// matters is that both streams get the same history.
			_, _ = b.db.Pool.Exec(ctx, `SELECT * FROM annals.delete_stream($1, NULL, $2)`, stream, op.pre == "tombstone")
		}
		var exp *int64
		switch op.expected {
		case "any":
		case "cur":
			exp = &cur
		case "cur+1":
			exp = newp(cur + 1)
		case "cur-1":
			exp = newp(cur - 1)
		case "max":
			exp = newp(int64(9223372036854775807))
		default:
			var v int64
			fmt.Sscan(op.expected, &v)
			exp = &v
		}
		id := uuid.New()
		switch {
		case op.reuse >= 0:
			id = ids[op.reuse]
		case op.reuse == -2:
			id = foreign[fn]
		}
		if op.stream != "" {
			stream = op.stream
		}
		ids[len(ids)-1] = id
		// The arguments as sent, one of them NULL when op.null names it
		// (append_batch gets a NULL element, or a NULL check_ids).
		var (
			streamArg      = &stream
			idArg          = &id
			typArg, datArg = &op.typ, &op.data
			checkArg       = &op.check
		)
		switch op.null {
		case "stream":
			streamArg = nil
		case "id":
			idArg = nil
		case "type":
			typArg = nil
		case "data":
			datArg = nil
		case "check":
			checkArg = nil
		}
		var out appendOneOutcome
		var seq *int64
		var err error
		if fn == "one" {
			err = b.db.Pool.QueryRow(ctx, `SELECT status, global_sequence, stream_version, actual_version
			      FROM annals.append_one($1, $2, $3, $4, $5, $6, $7)`, streamArg, exp, idArg, typArg, datArg, op.meta, checkArg).
				Scan(&out.status, &seq, &out.version, &out.actua)
		} else {
			rows, qerr := b.db.Pool.Query(ctx, `SELECT status, global_sequence, stream_version, actual_version
			      FROM annals.append_batch($1, $2, '{1}', '{1}', $3, $4, $5, $6, $7)`,
				[]*string{streamArg}, []*int64{exp}, []*uuid.UUID{idArg}, []*string{typArg}, []*string{datArg}, []*string{op.meta}, checkArg)
			err = qerr
			if err == nil {
				n := 0
				for rows.Next() {
					n++
					if err = rows.Scan(&out.status, &seq, &out.version, &out.actua); err != nil {
						break
					}
				}
				rows.Close()
				if err == nil {
					err = rows.Err()
				}
				if err == nil && n != 1 {
					t.Fatalf("append_batch of one event returned %d rows", n)
				}
			}
		}
		if err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				t.Fatalf("%s: %v", fn, err)
			}
			if pgErr.Code == "23505" { // a re-append without check: the detail names this stream's ID
				return appendOneOutcome{code: pgErr.Code, detail: pgErr.ConstraintName}
			}
			if op.null == "check" {
				// Each function names its own parameter: append_batch
				// reports its arguments' shape ("arrays"), append_one
				// "check_id". Both must refuse with AN002 before anything
				// else, bad input or not.
				want := map[string]string{"one": `{"event": 0, "field": "check_id"}`, "batch": `{"event": 0, "field": "arrays"}`}[fn]
				if pgErr.Code != "AN002" || pgErr.Detail != want {
					t.Fatalf("%s with a NULL check: %s %s, want AN002 %s", fn, pgErr.Code, pgErr.Detail, want)
				}
				return appendOneOutcome{code: pgErr.Code, detail: "NULL check"}
			}
			return appendOneOutcome{code: pgErr.Code, detail: pgErr.Detail}
		}
		out.wrote = seq != nil
		return out
	}

	seen := map[string]int{}
	for seqNo := range 200 {
		ops := make([]appendOneOp, 4+rng.IntN(6))
		for i := range ops {
			op := appendOneOp{
				expected: expecteds[pick(7, len(expecteds))],
				reuse:    -1,
				typ:      types[pick(2, len(types))],
				data:     datas[pick(3, len(datas))],
				meta:     metas[pick(4, len(metas))],
				check:    rng.IntN(3) > 0,
			}
			if i > 0 && rng.IntN(3) == 0 {
				op.reuse = rng.IntN(i)
			} else if rng.IntN(12) == 0 {
				op.reuse = -2
			}
			if rng.IntN(15) == 0 {
				op.stream = badStreams[rng.IntN(len(badStreams))]
			}
			if rng.IntN(8) == 0 {
				op.pre = []string{"delete", "tombstone"}[rng.IntN(2)]
			}
			if rng.IntN(20) == 0 {
				op.null = []string{"stream", "id", "type", "data", "check"}[rng.IntN(5)]
				if rng.IntN(2) == 0 {
					// Half the NULL steps have nothing else wrong, so
					// that the NULL alone decides the answer (counted
					// below); the others meet the other faults' order.
					op.clean = true
					op.stream, op.typ, op.data, op.meta = "", "t", `{"a": 1}`, nil
					if op.expected == "-2" || op.expected == "max" {
						op.expected = "any"
					}
				}
			}
			ops[i] = op
		}
		streams := map[string]string{"one": fmt.Sprintf("one-%d", seqNo), "batch": fmt.Sprintf("batch-%d", seqNo)}
		ids := map[string][]uuid.UUID{}
		cur := map[string]int64{}
		for i, op := range ops {
			got := map[string]appendOneOutcome{}
			for _, fn := range []string{"one", "batch"} {
				ids[fn] = append(ids[fn], uuid.Nil)
				// A re-append reuses the ID this function's stream got at
				// that step; the other stream has its own IDs.
				got[fn] = run(fn, streams[fn], op, ids[fn], cur[fn])
				var v int64
				if err := b.db.Pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM annals.streams WHERE stream_id = $1`,
					streams[fn]).Scan(&v); err != nil {
					t.Fatal(err)
				}
				cur[fn] = v
			}
			if o := got["one"]; o.code != "" {
				seen[o.code]++
				if op.clean {
					seen["NULL "+op.null]++
				}
			} else {
				seen[fmt.Sprintf("status %d", o.status)]++
			}
			if got["one"].String() != got["batch"].String() {
				t.Fatalf("sequence %d step %d %+v (meta %v):\n append_one:   %v\n append_batch: %v",
					seqNo, i, op, deref(op.meta), got["one"], got["batch"])
			}
		}
	}
	// What the steps met: every status and both input errors, or the test
	// proves less than it says.
	for _, want := range []string{"status 0", "status 1", "status 2", "status 3", "status 4", "status 5", "AN002", "22P02",
		"NULL stream", "NULL id", "NULL type", "NULL data", "NULL check"} {
		if seen[want] == 0 {
			t.Errorf("no step answered %s (seen: %v)", want, seen)
		}
	}
	t.Logf("outcomes: %v", seen)
}

// TestAppendOneOutcomes checks the statuses a Store reports for lone
// single-event appends, which travel through append_one: each must have
// come up in TestAppendOneMatchesAppendBatch's random steps too, but here
// each is asserted by name.
func TestAppendOneOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	ev := func(id uuid.UUID, total int) eventstore.EventData {
		return eventstore.EventData{ID: id, Data: OrderPlaced{OrderID: "o", Total: total}}
	}
	id := uuid.New()
	first, err := b.store.Append(ctx, "lone", eventstore.NoStream, ev(id, 1))
	if err != nil || first.StreamVersion != 1 || len(first.Events) != 1 || first.Events[0].ID != id {
		t.Fatalf("first append: %+v, %v", first, err)
	}
	// Stored already: the stored position, whatever the expected version.
	again, err := b.store.Append(ctx, "lone", eventstore.Exact(7), ev(id, 1))
	if err != nil || again.Events[0].GlobalSequence != first.Events[0].GlobalSequence || again.StreamVersion != 1 {
		t.Fatalf("idempotent re-append: %+v, %v; want the stored position %+v", again, err, first)
	}
	// The same ID with other data.
	if _, err := b.store.Append(ctx, "lone", eventstore.Any, ev(id, 2)); !errors.Is(err, eventstore.ErrEventIDConflict) {
		t.Fatalf("same ID, other data: %v, want ErrEventIDConflict", err)
	}
	// A wrong expected version reports the actual one.
	_, err = b.store.Append(ctx, "lone", eventstore.Exact(5), ev(uuid.New(), 3))
	var wrong *eventstore.WrongExpectedVersionError
	if !errors.As(err, &wrong) || wrong.Actual != 1 {
		t.Fatalf("wrong expected version: %v, want actual 1", err)
	}
	// Exact, Any and StreamExists on a live stream advance it by one.
	for i, exp := range []eventstore.ExpectedVersion{eventstore.Exact(1), eventstore.Any, eventstore.StreamExists} {
		res, err := b.store.Append(ctx, "lone", exp, ev(uuid.New(), 4))
		if err != nil || res.StreamVersion != int64(i+2) {
			t.Fatalf("append %d (%v): %+v, %v", i, exp, res, err)
		}
	}
	// StreamExists on a missing stream.
	if _, err := b.store.Append(ctx, "missing", eventstore.StreamExists, ev(uuid.New(), 5)); !errors.As(err, &wrong) || wrong.Actual != 0 {
		t.Fatalf("StreamExists on a missing stream: %v", err)
	}
	// A deleted stream: refused unless the append expects exactly its
	// version, which recreates it.
	del, err := b.store.DeleteStream(ctx, "lone", eventstore.Any, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Append(ctx, "lone", eventstore.Any, ev(uuid.New(), 6)); !errors.Is(err, eventstore.ErrStreamDeleted) {
		t.Fatalf("append to a deleted stream: %v, want ErrStreamDeleted", err)
	}
	res, err := b.store.Append(ctx, "lone", eventstore.Exact(del.StreamVersion), ev(uuid.New(), 7))
	if err != nil || res.StreamVersion != del.StreamVersion+1 {
		t.Fatalf("recreating append: %+v, %v", res, err)
	}
	if _, err := b.store.DeleteStream(ctx, "lone", eventstore.Any, &eventstore.DeleteOptions{Hard: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Append(ctx, "lone", eventstore.Any, ev(uuid.New(), 8)); !errors.Is(err, eventstore.ErrStreamTombstoned) {
		t.Fatalf("append to a tombstoned stream: %v, want ErrStreamTombstoned", err)
	}
	// Bad input is refused before anything is written.
	if _, err := b.store.Append(ctx, strings.Repeat("s", 513), eventstore.Any, ev(uuid.New(), 9)); !errors.Is(err, eventstore.ErrInvalidEvent) {
		t.Fatalf("a 513-byte stream ID: %v, want ErrInvalidEvent", err)
	}
}

func deref(p *string) any {
	if p == nil {
		return nil
	}
	return *p
}

func newp[T any](v T) *T { return &v }

// TestLoneAppendBeforeMigration0018: a client deployed before `annals
// migrate` added append_one (a schema at 0017) still appends lone events,
// through append_batch, with the same outcomes.
func TestLoneAppendBeforeMigration0018(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	if _, err := b.db.Pool.Exec(ctx, `DROP FUNCTION annals.append_one(text, bigint, uuid, text, text, text, boolean)`); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		res, err := b.store.Append(ctx, "old-schema", eventstore.Exact(int64(i)), eventstore.EventData{Data: OrderPlaced{OrderID: "o", Total: i}})
		if err != nil || res.StreamVersion != int64(i+1) {
			t.Fatalf("append %d: %+v, %v", i, res, err)
		}
	}
	var wrong *eventstore.WrongExpectedVersionError
	if _, err := b.store.Append(ctx, "old-schema", eventstore.Exact(1), eventstore.EventData{Data: OrderPlaced{OrderID: "o"}}); !errors.As(err, &wrong) || wrong.Actual != 3 {
		t.Fatalf("wrong expected version: %v, want actual 3", err)
	}
}
