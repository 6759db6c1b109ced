package relay_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/relay"
)

// TestRelayRecordsRewindUnderRepeatableReadDefault: two instances of the
// relay, each with a pool of its own whose sessions default to REPEATABLE
// READ, find the log rewound under the stream at once and record it; the
// test holds the relay's row so that both wait for it, then lets them go
// together. Both say where the stream and the log last agree, and the
// rewind is recorded. Before, the second one's row lock met the first
// one's record after its snapshot and failed to serialize (40001): it said
// that finding where they agree failed.
func TestRelayRecordsRewindUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	appendMany(t, b.store, 15)
	first, err := relay.New(b.db.Pool, b.nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	annalstest.RewindLog(t, b.db.Pool, "annals", 10)
	appendMany(t, b.store, 8)
	b.db.SetDefaultIsolation(t, "repeatable read")
	relays := make([]*relay.Relay, 2)
	for i := range relays {
		var err error
		if relays[i], err = relay.New(b.db.NewPool(t), b.nc, nil); err != nil {
			t.Fatal(err)
		}
	}
	hold, err := b.db.Pool.Begin(ctx) // b.db.Pool's sessions predate the ALTER: READ COMMITTED
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := hold.Exec(ctx, `SELECT FROM annals.relay_acks WHERE subscriber_id = 'relay' AND partition = 0 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(relays))
	for i, r := range relays {
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i] = r.EnsureStream(ctx) }()
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for waiting := 0; waiting < len(relays); {
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'
			  AND query LIKE '%relay_acks%FOR UPDATE%' AND pid <> pg_backend_pid()`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= len(relays) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d relays waited for their row: %v", waiting, len(relays), ctx.Err())
		case <-tick.C:
		}
	}
	if err := hold.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "last agree at position 10: recorded") {
			t.Errorf("relay %d: %v; want ErrStreamMismatch saying they last agree at 10, recorded", i, err)
		}
	}
	if _, _, at := recordedRewind(t, b.db.Pool); at != 10 {
		t.Fatalf("recorded at %d, want 10", at)
	}
}
