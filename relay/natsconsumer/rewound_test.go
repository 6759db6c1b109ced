package natsconsumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/relay"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// TestARewoundLogStops: the source database was restored from a backup
// (or failed over to a replica that lacked its newest events) and gave the
// positions of the events it lost to new ones; the relay's stream was made
// again and published from the start. Here: events 1..8 published again as
// they were, then new events at positions 9, 10 and 11. A running Run and a
// restarted RunProjection, which handled 1..10, stop with ErrLogRewound
// (*RewoundError naming position 10 and both IDs) at the new event at 10,
// before handling it or 11, and the next RunProjection stops there again.
// Before, both acknowledged the new 9 and 10 without handling them, as
// events handled before, and went on with 11: the read model kept events
// the log no longer has and never saw the new ones.
func TestARewoundLogStops(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 10)
	var old []eventstore.Event
	for ev, err := range e.store.ReadAll(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		old = append(old, ev)
	}

	var mu sync.Mutex
	seen := map[int64]int{}
	rc, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "run", Batch: 4, RetryBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() {
		runErr <- rc.Run(ctx, func(_ context.Context, ev eventstore.Event) error {
			mu.Lock()
			defer mu.Unlock()
			seen[ev.GlobalSequence]++
			return nil
		})
	}()
	cfg := &natsconsumer.Config{Durable: "tally", Batch: 4}
	pc, err := natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopProjection := start(ctx, func(ctx context.Context) error { return pc.RunProjection(ctx, e.dst.Pool, tally{}) })
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == 10 && e.tallied(ctx) == once(10)
	})
	if err := stopProjection(); err != nil {
		t.Fatal(err)
	}

	// The rewound log, published into a stream made again.
	e.deleteStream(t, ctx)
	if _, err := e.r.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	publish := func(ev eventstore.Event) {
		t.Helper()
		m, err := relay.Message("relay", "annals."+relay.EscapeToken(ev.Type)+"."+relay.EscapeToken(ev.StreamID), ev)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, ev := range old[:8] {
		publish(ev)
	}
	for pos := int64(9); pos <= 11; pos++ {
		ev := old[7]
		ev.ID, ev.GlobalSequence, ev.StreamVersion, ev.RecordedAt = uuid.New(), pos, pos, time.Now()
		publish(ev)
	}

	check := func(what string, err error) {
		t.Helper()
		var rw *natsconsumer.RewoundError
		if !errors.Is(err, natsconsumer.ErrLogRewound) || !errors.As(err, &rw) || rw.Position != 10 || rw.Handled != old[9].ID || rw.Found == old[9].ID {
			t.Fatalf("%s: %v (%+v), want ErrLogRewound at position 10, handled %s", what, err, rw, old[9].ID)
		}
	}
	pc, err = natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	check("RunProjection", pc.RunProjection(ctx, e.dst.Pool, tally{}))
	check("RunProjection again", pc.RunProjection(ctx, e.dst.Pool, tally{}))
	if got := e.tallied(ctx); got != once(10) {
		t.Errorf("tally %s after the rewound log, want 1..10 once (nothing of the new events)", got)
	}
	// Run, still running when the stream was made again, stops by itself.
	select {
	case err := <-runErr:
		check("Run", err)
	case <-ctx.Done():
		t.Fatal("Run did not end")
	}
	mu.Lock()
	defer mu.Unlock()
	if seen[11] != 0 || len(seen) != 10 {
		t.Errorf("Run handled %v, want 1..10 only", seen)
	}
}
