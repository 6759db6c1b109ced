package walsource_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/walsource"
)

// TestWakeSignalsOnlyItsPartition: the Waker of partition 1 of 2 signals
// for an event of a stream in partition 1 and not for one in partition 0
// (whose read would find nothing for it), partitioned by stream and by
// category. AdvanceAfter is an hour here, so that only the events' own
// signals are seen.
func TestWakeSignalsOnlyItsPartition(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var decoded atomic.Int64 // the last position a Source decoded
	wake, err := walsource.NewWake(ctx, db.Pool, &walsource.WakeConfig{
		StatusInterval: 50 * time.Millisecond, AdvanceAfter: time.Hour,
		OnCommit: func(_ string, _ int, c walsource.Commit) { decoded.Store(c.Last) },
	})
	if err != nil {
		t.Fatal(err)
	}
	// streamIn returns a stream whose partition key (the stream ID, or the
	// category before its first "-") falls in partition p of 2.
	streamIn := func(by string, p int) string {
		for i := 0; ; i++ {
			key := fmt.Sprintf("k%d", i)
			var got int
			if err := db.Pool.QueryRow(ctx, `SELECT annals.stream_partition($1, 2)`, key).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != p {
				continue
			}
			if by == catchup.PartitionByCategory {
				return key + "-1"
			}
			return key
		}
	}
	for _, by := range []string{catchup.PartitionByStream, catchup.PartitionByCategory} {
		t.Run(by, func(t *testing.T) {
			name := "parts-" + by
			dropSlotAtEnd(t, db.Pool, wake.Slot(name, 1))
			waker, stop := wake.For(ctx, &catchup.Subscription{Name: name, Partition: 1, Partitions: 2, PartitionBy: by}, nil)
			t.Cleanup(stop)
			signal, unsubscribe := waker.Subscribe()
			t.Cleanup(unsubscribe)
			select {
			case <-waker.Listening():
			case <-time.After(time.Minute):
				t.Fatal("the Waker did not start streaming within a minute")
			}
			signalled := func() bool {
				select {
				case <-signal:
					return true
				default:
					return false
				}
			}
			annalstest.WaitFor(t, 10*time.Second, signalled) // the (re)connect's signal
			appendTo := func(stream string) int64 {
				t.Helper()
				r, err := store.Append(ctx, stream, eventstore.Any, eventstore.EventData{Type: "moved", Data: map[string]int{}})
				if err != nil {
					t.Fatal(err)
				}
				return r.Events[len(r.Events)-1].GlobalSequence
			}
			other := appendTo(streamIn(by, 0))
			annalstest.WaitFor(t, 10*time.Second, func() bool { return decoded.Load() >= other })
			if signalled() {
				t.Fatalf("partition 1 was signalled for an event of partition 0")
			}
			appendTo(streamIn(by, 1))
			annalstest.WaitFor(t, 10*time.Second, signalled)
		})
	}
}
