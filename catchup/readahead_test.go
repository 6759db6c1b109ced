package catchup_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
)

// failingRecorder is a Processor that fails on chosen calls and records what it
// accounted for: on success every event of the batch, on a failure the
// events up to the position it reports, as a projection that commits the
// events before a failing one does.
type failingRecorder struct {
	nopProcessor // Start, Redeliver, Idle, End
	mu           sync.Mutex
	calls        int
	done         []eventstore.Event
	failAt       map[int]int // call number -> how many of the batch's events succeed
	changedAt    map[int]bool
}

func (r *failingRecorder) Process(_ context.Context, lease *catchup.Lease, b catchup.Batch) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if ok, fail := r.failAt[r.calls]; fail && ok < len(b.Events) {
		r.done = append(r.done, b.Events[:ok]...)
		through := b.After
		if ok > 0 {
			through = b.Events[ok-1].GlobalSequence
		}
		return through, errors.Newf("planned failure at call %d", r.calls)
	}
	if r.changedAt[r.calls] {
		lease.Changed()
	}
	r.done = append(r.done, b.Events...)
	return b.Through, nil
}

// appendEvents appends n events over 7 streams, 25 to an append.
func appendEvents(t *testing.T, store *eventstore.Store, n int) {
	t.Helper()
	for i := 0; i < n; i += 25 {
		evs := make([]eventstore.EventData, 0, 25)
		for j := i; j < min(i+25, n); j++ {
			evs = append(evs, eventstore.EventData{Type: fmt.Sprintf("t.%d", j%3), Data: map[string]int{"j": j},
				Metadata: eventstore.Metadata{CorrelationID: fmt.Sprintf("c%d", j)}})
		}
		if _, err := store.Append(t.Context(), fmt.Sprintf("s-%d", (i/25)%7), eventstore.Any, evs...); err != nil {
			t.Fatal(err)
		}
	}
}

// checkExactlyOnce fails unless done is every event of the log, once each,
// in position order, with its payload and metadata intact.
func checkExactlyOnce(t *testing.T, store *eventstore.Store, done []eventstore.Event) {
	t.Helper()
	var want []eventstore.Event
	for ev, err := range store.ReadAll(t.Context(), 0) {
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, ev)
	}
	if len(done) != len(want) {
		t.Fatalf("processed %d events, the log holds %d", len(done), len(want))
	}
	for i := range want {
		g, w := done[i], want[i]
		if g.GlobalSequence != w.GlobalSequence || g.ID != w.ID || g.StreamID != w.StreamID || g.StreamVersion != w.StreamVersion ||
			g.Type != w.Type || string(g.Data) != string(w.Data) || g.Metadata.CorrelationID != w.Metadata.CorrelationID ||
			!g.RecordedAt.Equal(w.RecordedAt) {
			t.Fatalf("event %d: processed %+v, the log has %+v", i, g, w)
		}
	}
}

// A partition far behind reads several batches in one statement while it
// processes the one before (Reading ahead in the package doc). Failures
// and Lease.Changed in the middle of such a read must discard what was
// read ahead: every event is still accounted for once, in order. Run over
// the extended protocol (binary rows, decoded by hand) and the simple
// protocol (text rows, through pgx's Scan).
func TestReadAheadExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := annalstest.NewDB(t, nil)
			store, err := eventstore.New(db.Pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			const n = 3000
			appendEvents(t, store, n)
			cfg, err := pgxpool.ParseConfig(db.URL)
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			e, err := catchup.NewEngine(pool, nil, &catchup.Config{RetryBackoff: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			head, err := e.Head(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			// Batches of 50: a read ahead asks for 80 of them. Call 3 is the
			// first batch of a read ahead; calls 5, 23 and 41 fail part-way,
			// call 30 reports a change.
			r := &failingRecorder{failAt: map[int]int{5: 17, 23: 0, 41: 49}, changedAt: map[int]bool{30: true}}
			sub := &catchup.Subscription{Name: "readahead", BatchSize: 50, Processor: r}
			if err := e.CatchUp(t.Context(), sub, head); err != nil {
				t.Fatal(err)
			}
			checkExactlyOnce(t, store, r.done)
			if r.calls <= 41 {
				t.Fatalf("%d calls of Process: the failures planned were not all met", r.calls)
			}
		})
	}
}
