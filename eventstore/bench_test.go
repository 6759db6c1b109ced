package eventstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
