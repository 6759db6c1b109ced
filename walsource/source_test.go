package walsource_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/walsource"
)

// collector records what a Source decodes.
type collector struct {
	mu      sync.Mutex
	events  []eventstore.Event
	commits int
}

func (c *collector) onCommit(cm walsource.Commit) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commits++
	c.events = append(c.events, cm.Events...)
}

func (c *collector) snapshot() []eventstore.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// runSource runs a Source until the returned stop is called or the test ends.
func runSource(t *testing.T, src *walsource.Source) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Source.Run: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("Source.Run did not return 15s after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// dropSlotAtEnd drops the slot before the test's database is dropped (a
// database with a logical slot cannot be dropped).
// dropSlotAtEnd creates the slot now and drops it when the test ends.
// Creating a logical slot waits for every transaction running in the
// cluster at that moment to end, and in make test other packages' tests
// hold some open for seconds; made up front, with time to spare, the slot
// does not eat into the deadlines of what the test measures. (Sources
// create their slot too when it is missing: walsource.EnsureSlot.)
func dropSlotAtEnd(t *testing.T, pool *pgxpool.Pool, slot string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if _, err := walsource.EnsureSlot(ctx, pool, slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := walsource.DropSlot(ctx, pool, slot); err != nil {
			t.Error(err)
		}
	})
}

func appendN(t *testing.T, store *eventstore.Store, from, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := from; i < from+n; i++ {
		md := eventstore.Metadata{CorrelationID: fmt.Sprintf("corr-%d", i), Extra: map[string]any{"n": float64(i)}}
		_, err := store.Append(ctx, fmt.Sprintf("s-%d", i%5), eventstore.Any, eventstore.EventData{
			Type: "thing.happened", Data: json.RawMessage(fmt.Sprintf(`{"i": %d, "s": "é\"x"}`, i)), Metadata: md,
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func readLog(t *testing.T, store *eventstore.Store) []eventstore.Event {
	t.Helper()
	var out []eventstore.Event
	for e, err := range store.ReadAll(context.Background(), 0) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// TestSourceDecodesTheLog: what the Source decodes from the WAL is the log,
// field for field and in position order, including events appended in one
// transaction.
func TestSourceDecodesTheLog(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	slot := walsource.SlotName(db.Name, db.Schema, "decode", 0)
	dropSlotAtEnd(t, db.Pool, slot)
	var c collector
	src, err := walsource.New(db.Pool, &walsource.Config{Slot: slot, OnCommit: c.onCommit, StatusInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := walsource.EnsurePublication(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	if _, err := walsource.EnsureSlot(ctx, db.Pool, slot); err != nil {
		t.Fatal(err)
	}
	runSource(t, src)
	appendN(t, store, 0, 20)
	// Three events in one transaction: one Commit.
	if _, err := store.Append(ctx, "multi", eventstore.NoStream,
		eventstore.EventData{Type: "a", Data: json.RawMessage(`{}`)},
		eventstore.EventData{Type: "b", Data: json.RawMessage(`[1]`)},
		eventstore.EventData{Type: "c", Data: json.RawMessage(`{"x":null}`)}); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return len(c.snapshot()) >= 23 })
	want := readLog(t, store)
	got := c.snapshot()
	if len(got) != len(want) {
		t.Fatalf("decoded %d events, the log has %d", len(got), len(want))
	}
	for i := range want {
		w, g := want[i], got[i]
		if g.GlobalSequence != w.GlobalSequence || g.ID != w.ID || g.StreamID != w.StreamID ||
			g.StreamVersion != w.StreamVersion || g.Type != w.Type || string(g.Data) != string(w.Data) ||
			!g.RecordedAt.Equal(w.RecordedAt) || g.Metadata.CorrelationID != w.Metadata.CorrelationID ||
			fmt.Sprint(g.Metadata.Extra) != fmt.Sprint(w.Metadata.Extra) {
			t.Fatalf("event %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
	c.mu.Lock()
	commits := c.commits
	c.mu.Unlock()
	if commits != 21 {
		t.Fatalf("%d commits, want 21", commits)
	}
}

// TestSlotKeepsWhatIsNotCheckpointed: the Source confirms the slot only
// through the consumer's checkpoint. While the checkpoint stays behind, and
// while nobody streams, the slot keeps every event: a new Source on it
// receives them all again; once the checkpoint passes them, they are
// confirmed and not sent again.
func TestSlotKeepsWhatIsNotCheckpointed(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	slot := walsource.SlotName(db.Name, db.Schema, "keep", 0)
	dropSlotAtEnd(t, db.Pool, slot)
	if _, err := walsource.EnsurePublication(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	if _, err := walsource.EnsureSlot(ctx, db.Pool, slot); err != nil {
		t.Fatal(err)
	}
	var checkpoint atomic.Int64
	newSource := func(c *collector) *walsource.Source {
		src, err := walsource.New(db.Pool, &walsource.Config{
			Slot: slot, OnCommit: c.onCommit, StatusInterval: 20 * time.Millisecond,
			Confirmed: func(context.Context) (int64, error) { return checkpoint.Load(), nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	confirmed := func() string {
		var lsn string
		if err := db.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		return lsn
	}
	positions := func(es []eventstore.Event) []int64 {
		var out []int64
		for _, e := range es {
			out = append(out, e.GlobalSequence)
		}
		return out
	}

	var c1 collector
	src1 := newSource(&c1)
	stop := runSource(t, src1)
	appendN(t, store, 0, 10)
	annalstest.WaitFor(t, 10*time.Second, func() bool { return len(c1.snapshot()) == 10 })
	before := confirmed()
	// Several status updates with the checkpoint at 0: nothing confirmed.
	sent := src1.StatusUpdates()
	annalstest.WaitFor(t, 10*time.Second, func() bool { return src1.StatusUpdates() >= sent+5 })
	stop()
	if after := confirmed(); after != before {
		t.Fatalf("the slot was confirmed from %s to %s with the checkpoint at 0", before, after)
	}
	appendN(t, store, 10, 15) // while nobody streams

	var c2 collector
	stop = runSource(t, newSource(&c2))
	annalstest.WaitFor(t, 10*time.Second, func() bool { return len(c2.snapshot()) >= 25 })
	if got := positions(c2.snapshot()); !slices.Equal(got, positions(readLog(t, store))) {
		t.Fatalf("after the downtime the slot sent %v, want the whole log", got)
	}
	checkpoint.Store(25)
	annalstest.WaitFor(t, 10*time.Second, func() bool { return confirmed() != before })
	stop()

	var c3 collector
	runSource(t, newSource(&c3))
	appendN(t, store, 25, 1)
	annalstest.WaitFor(t, 10*time.Second, func() bool { return len(c3.snapshot()) >= 1 })
	if got := positions(c3.snapshot()); !slices.Equal(got, []int64{26}) {
		t.Fatalf("after the checkpoint passed 25, the slot sent %v, want [26]", got)
	}
}

// TestSourceTakesOverAnActiveSlot: a Source whose slot is still streamed by
// a stale session (a former leader that has not noticed it lost its lock)
// ends that session and streams; once the stale Source stops, the new one
// receives every later commit.
func TestSourceTakesOverAnActiveSlot(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	slot := walsource.SlotName(db.Name, db.Schema, "takeover", 0)
	dropSlotAtEnd(t, db.Pool, slot)
	newSource := func(c *collector) *walsource.Source {
		src, err := walsource.New(db.Pool, &walsource.Config{Slot: slot, OnCommit: c.onCommit, StatusInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	activePID := func() int32 {
		var pid int32
		_ = db.Pool.QueryRow(t.Context(), `SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid)
		return pid
	}
	var old, fresh collector
	stopOld := runSource(t, newSource(&old))
	annalstest.WaitFor(t, 10*time.Second, func() bool { return activePID() != 0 })
	oldPID := activePID()
	runSource(t, newSource(&fresh))
	annalstest.WaitFor(t, 10*time.Second, func() bool { p := activePID(); return p != 0 && p != oldPID })
	stopOld()
	appendN(t, store, 0, 10)
	annalstest.WaitFor(t, 10*time.Second, func() bool { return len(fresh.snapshot()) >= 10 })
	if got := len(fresh.snapshot()); got != 10 {
		t.Fatalf("the new Source received %d events, want 10", got)
	}
}
