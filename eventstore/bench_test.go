package eventstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
)

// BenchmarkAppend measures one single-event Append (encode, the SQL
// function, commit) against a real PostgreSQL: the client-side and
// server-side cost of the input checks shows up here.
func BenchmarkAppend(b *testing.B) {
	ctx := context.Background()
	bb := setup(b, nil)
	ev := eventstore.NewEvent(OrderPlaced{OrderID: "order-1", Total: 100})
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := bb.store.Append(ctx, fmt.Sprintf("bench-%d", i), eventstore.NoStream, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncode measures the client-side validation and encoding of a
// ten-event append without a round trip.
func BenchmarkEncode(b *testing.B) {
	ctx := context.Background()
	bb := setup(b, nil)
	evs := make([]eventstore.EventData, 10)
	for i := range evs {
		evs[i] = eventstore.EventData{
			Data:     OrderPlaced{OrderID: fmt.Sprintf("order-%d", i), Total: i},
			Metadata: eventstore.Metadata{CorrelationID: "req-7", Extra: map[string]any{"tenant": "acme"}},
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bb.store.Encode(ctx, "order-1", eventstore.Any, evs...); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSQLInputCheck measures, inside PostgreSQL, what the input checks
// of check_event_input cost compared with the whole append_events that calls
// them: n calls of each run in one statement, so the round trip is
// amortized. It reports µs per call of each and the check's share of the
// append (check_%). Run with fsync off:
//
//	annals dev --fsync=false -- go test -run XXX -bench SQLInputCheck ./eventstore/
func BenchmarkSQLInputCheck(b *testing.B) {
	ctx := context.Background()
	bb := setup(b, nil)
	one := `{"type":"order.placed","data":{"order_id":"order-1","total":100},"metadata":{"correlation_id":"req-7","tenant":"acme"}}`
	round := 0 // across the sub-benchmark's runs: every append makes new streams
	for _, events := range []int{1, 10} {
		b.Run(fmt.Sprintf("events=%d", events), func(b *testing.B) {
			payload := "[" + strings.TrimSuffix(strings.Repeat(one+",", events), ",") + "]"
			const n = 500
			var check, appendT time.Duration
			calls := 0
			for b.Loop() {
				calls += n
				round++
				start := time.Now()
				if _, err := bb.db.Pool.Exec(ctx, `SELECT count(*) FROM generate_series(1, $2) i,
					LATERAL annals.check_event_input('order-' || i, 0, $1::jsonb) c`, payload, n); err != nil {
					b.Fatal(err)
				}
				check += time.Since(start)
				start = time.Now()
				if _, err := bb.db.Pool.Exec(ctx, `SELECT count(*) FROM generate_series(1, $2) i,
					LATERAL annals.append_events('bench-' || $3::int || '-' || $4::int || '-' || i, 0, $1::jsonb) a`, payload, n, events, round); err != nil {
					b.Fatal(err)
				}
				appendT += time.Since(start)
			}
			b.ReportMetric(float64(check.Microseconds())/float64(calls), "check_µs/call")
			b.ReportMetric(float64(appendT.Microseconds())/float64(calls), "append_µs/call")
			b.ReportMetric(100*float64(check)/float64(appendT), "check_%")
		})
	}
}

// benchEvent is an event of about 300 bytes of data and some metadata.
func benchEvent(i int) eventstore.EventData {
	lines := make([]string, 4)
	for j := range lines {
		lines[j] = fmt.Sprintf(`{"sku": "SKU-%04d-%d", "qty": %d, "price": 12.5e0, "note": "gift wrap"}`, i, j, j+1)
	}
	return eventstore.EventData{Type: "order.placed",
		Data:     json.RawMessage(fmt.Sprintf(`{"order_id": "order-%d", "total": 1e2, "lines": [%s]}`, i, strings.Join(lines, ", "))),
		Metadata: eventstore.Metadata{CorrelationID: "req-7", Extra: map[string]any{"tenant": "acme"}}}
}

// BenchmarkTransactAppend measures Transact with one append of n events
// (about 300 bytes of data each) through append_events_json, and through
// append_events as before migration 0035 (which rewrites the data as
// jsonb), alternately: each iteration makes one of each, and the metrics
// are the mean time of each and their ratio.
//
//	annals dev -- sh -c 'ANNALS_TEST_DATABASE_URL=$DATABASE_URL go test -run XXX -bench TransactAppend -count 3 ./eventstore/'
func BenchmarkTransactAppend(b *testing.B) {
	ctx := context.Background()
	bb := setup(b, nil)
	jsonb, err := eventstore.New(bb.db.Pool, &eventstore.Config{Registry: bb.reg})
	if err != nil {
		b.Fatal(err)
	}
	eventstore.AppendThroughJSONB(jsonb)
	stream := 0
	for _, n := range []int{1, 10, 100} {
		events := make([]eventstore.EventData, n)
		for i := range events {
			events[i] = benchEvent(i)
		}
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			var asJSON, asJSONB time.Duration
			calls := 0
			for b.Loop() {
				calls++
				for _, via := range []struct {
					store *eventstore.Store
					t     *time.Duration
				}{{bb.store, &asJSON}, {jsonb, &asJSONB}} {
					stream++
					start := time.Now()
					if _, err := via.store.Transact(ctx, func(_ context.Context, _ pgx.Tx, batch *eventstore.Batch) error {
						return batch.Append(fmt.Sprintf("bench-%d", stream), eventstore.NoStream, events...)
					}); err != nil {
						b.Fatal(err)
					}
					*via.t += time.Since(start)
				}
			}
			b.ReportMetric(float64(asJSON.Microseconds())/float64(calls), "json_µs/op")
			b.ReportMetric(float64(asJSONB.Microseconds())/float64(calls), "jsonb_µs/op")
			b.ReportMetric(float64(asJSON)/float64(asJSONB), "json/jsonb")
		})
	}
}

// BenchmarkAppendTx measures AppendTx of one event (about 300 bytes of
// data) in a transaction of its own: begin, the append, commit. What the
// client does to choose the append function per transaction shows here,
// beside a round trip and a commit.
//
//	annals dev -- sh -c 'ANNALS_TEST_DATABASE_URL=$DATABASE_URL go test -run XXX -bench AppendTx -count 5 ./eventstore/'
func BenchmarkAppendTx(b *testing.B) {
	ctx := context.Background()
	bb := setup(b, nil)
	ev := benchEvent(1)
	stream := 0
	b.ReportAllocs()
	for b.Loop() {
		stream++
		if err := pgx.BeginFunc(ctx, bb.db.Pool, func(tx pgx.Tx) error {
			_, err := bb.store.AppendTx(ctx, tx, fmt.Sprintf("bench-%d", stream), eventstore.NoStream, ev)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSQLAppendJSON measures, inside PostgreSQL, append_events_json
// against append_events for the same events: n calls of each in one
// statement (no round trip, one commit), alternately, reported in µs per
// call of each and the ratio.
func BenchmarkSQLAppendJSON(b *testing.B) {
	ctx := context.Background()
	bb := setup(b, nil)
	round := 0
	for _, events := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("events=%d", events), func(b *testing.B) {
			enc, err := bb.store.Encode(ctx, "x", eventstore.Any, func() []eventstore.EventData {
				evs := make([]eventstore.EventData, events)
				for i := range evs {
					evs[i] = benchEvent(i)
				}
				return evs
			}()...)
			if err != nil {
				b.Fatal(err)
			}
			// Without IDs, as a producer that never retries sends them (the
			// Go client's IDs would make a second call an idempotent
			// re-append), the other keys in the Go client's order.
			body := regexp.MustCompile(`"event_id":"[0-9a-f-]{36}",`).ReplaceAll(enc.Events, nil)
			const n = 100
			var asJSON, asJSONB time.Duration
			calls := 0
			for b.Loop() {
				calls += n
				round++
				for _, f := range []struct {
					fn, typ string
					t       *time.Duration
				}{{"append_events_json", "json", &asJSON}, {"append_events", "jsonb", &asJSONB}} {
					start := time.Now()
					if _, err := bb.db.Pool.Exec(ctx, `SELECT count(*) FROM generate_series(1, $2) i,
						LATERAL annals.`+f.fn+`('bench-' || $3::int || '-' || $4::int || '-' || i || '`+f.typ+`', 0, $1::`+f.typ+`) a`,
						string(body), n, events, round); err != nil {
						b.Fatal(err)
					}
					*f.t += time.Since(start)
				}
			}
			b.ReportMetric(float64(asJSON.Microseconds())/float64(calls), "json_µs/call")
			b.ReportMetric(float64(asJSONB.Microseconds())/float64(calls), "jsonb_µs/call")
			b.ReportMetric(float64(asJSON)/float64(asJSONB), "json/jsonb")
		})
	}
}
