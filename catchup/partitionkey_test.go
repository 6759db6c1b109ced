package catchup_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
)

// recorder records the events of each partition in delivery order.
type recorder struct {
	nopProcessor
	mu   *sync.Mutex
	part int
	got  map[int][]eventstore.Event
}

func (r recorder) Process(_ context.Context, _ *catchup.Lease, b catchup.Batch) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got[r.part] = append(r.got[r.part], b.Events...)
	return b.Through, nil
}

// Partitioning by category or by a metadata field puts every event of one
// key in one partition, the one annals.stream_partition gives for the key,
// delivers each event once, and in position order within the partition (so
// per-key order holds), while streams of one key may interleave.
func TestPartitionKeys(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Four writers append concurrently to streams of 5 categories, 4
	// streams each, with 6 tenants in the metadata (one category's events
	// carry no tenant).
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				cat := fmt.Sprintf("cat%d", (i+w)%5)
				md := eventstore.Metadata{}
				if cat != "cat4" {
					md.Extra = map[string]any{"tenant": fmt.Sprintf("t%d", (i*7+w)%6)}
				}
				ev := eventstore.EventData{Type: "x.happened", Data: map[string]int{"i": i}, Metadata: md}
				stream := fmt.Sprintf("%s-%d", cat, (i+w)%4)
				if _, err := store.Append(ctx, stream, eventstore.Any, ev); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	e, err := catchup.NewEngine(db.Pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	head, err := e.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const parts = 4
	for _, tc := range []struct {
		by  string
		key func(ev eventstore.Event) string
	}{
		{catchup.PartitionByCategory, func(ev eventstore.Event) string { return strings.SplitN(ev.StreamID, "-", 2)[0] }},
		{"metadata:tenant", func(ev eventstore.Event) string {
			s, _ := ev.Metadata.Extra["tenant"].(string)
			return s
		}},
	} {
		t.Run(tc.by, func(t *testing.T) {
			var mu sync.Mutex
			got := map[int][]eventstore.Event{}
			for p := range parts {
				sub := &catchup.Subscription{Name: "by-" + tc.by, Partition: p, Partitions: parts, PartitionBy: tc.by,
					Processor: recorder{mu: &mu, part: p, got: got}}
				if err := e.CatchUp(ctx, sub, head); err != nil {
					t.Fatal(err)
				}
			}
			seen := map[int64]bool{}
			partOf := map[string]int{}
			for p, evs := range got {
				for i, ev := range evs {
					if seen[ev.GlobalSequence] {
						t.Fatalf("event %d delivered twice", ev.GlobalSequence)
					}
					seen[ev.GlobalSequence] = true
					if i > 0 && ev.GlobalSequence <= evs[i-1].GlobalSequence {
						t.Fatalf("partition %d: event %d after %d", p, ev.GlobalSequence, evs[i-1].GlobalSequence)
					}
					k := tc.key(ev)
					if q, ok := partOf[k]; ok && q != p {
						t.Fatalf("key %q in partitions %d and %d", k, q, p)
					}
					partOf[k] = p
				}
			}
			if int64(len(seen)) != head {
				t.Fatalf("%d events delivered, want %d", len(seen), head)
			}
			used := 0
			for _, evs := range got {
				if len(evs) > 0 {
					used++
				}
			}
			if used < 2 {
				t.Fatalf("every key landed in one partition: %v", partOf)
			}
			for k, p := range partOf {
				var want int
				if err := db.Pool.QueryRow(ctx, `SELECT annals.stream_partition($1, $2)`, k, parts).Scan(&want); err != nil {
					t.Fatal(err)
				}
				if p != want {
					t.Fatalf("key %q is in partition %d; annals.stream_partition says %d", k, p, want)
				}
			}
			t.Logf("%s: %d keys over %d partitions: %v", tc.by, len(partOf), used, partOf)
		})
	}
	bad := &catchup.Subscription{Name: "bad", Partitions: 2, PartitionBy: "metadata:", Processor: nopProcessor{}}
	if err := e.CatchUp(ctx, bad, head); !errors.Is(err, catchup.ErrInvalidPartitionBy) {
		t.Fatalf("PartitionBy %q: %v, want ErrInvalidPartitionBy", bad.PartitionBy, err)
	}
}
