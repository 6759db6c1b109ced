package eventstore

import (
	"testing"

	"github.com/google/uuid"
)

// encodeBatch's buffer is sized exactly (batchSize), so it is never
// regrown: with an exact and a NULL expected version, present and NULL
// metadata.
func TestEncodeBatchSizedExactly(t *testing.T) {
	ev := func(meta bool) encodedEvent {
		e := encodedEvent{id: uuid.New(), typ: "t.sized", data: []byte(`{"a":1}`)}
		if meta {
			e.meta = []byte(`{"correlation_id":"c"}`)
		}
		return e
	}
	group := []*pendingAppend{
		{args: appendArgs{stream: "s-1", expected: int64(3), count: 2, events: []encodedEvent{ev(true), ev(false)}}},
		{args: appendArgs{stream: "stream-two", expected: nil, count: 1, events: []encodedEvent{ev(true)}}},
	}
	params := encodeBatch(group, 3, true)
	total := 0
	for _, p := range params {
		total += len(p)
	}
	if want := batchSize(group, 3); total != want {
		t.Fatalf("arguments of %d bytes, batchSize %d: the buffer was sized wrong", total, want)
	}
}
