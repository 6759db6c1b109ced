package eventstore_test

import (
	"context"
	"fmt"
	"testing"

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
