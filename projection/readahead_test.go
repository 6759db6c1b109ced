package projection_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// readAheadProjection fails s1's first event permanently, after the
// engine's read of the next batch (made while this batch is processed) has
// finished: that read predates the dead letter.
type readAheadProjection struct {
	pool *pgxpool.Pool
	base int64 // the pool's AcquireCount before the run
	mu   sync.Mutex
	seen []string
}

func (p *readAheadProjection) Name() string { return "readahead" }

func (p *readAheadProjection) Handle(ctx context.Context, _ pgx.Tx, e eventstore.Event) error {
	if e.StreamID == "s1" && e.StreamVersion == 1 {
		// The runner's only uses of the pool are its head query and its
		// batch reads: wait until the read of batch 2 is done.
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if st := p.pool.Stat(); st.AcquireCount() >= p.base+3 && st.AcquiredConns() == 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		return annals.Permanent(errors.New("poison"))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, e.StreamID+"/"+string(rune('0'+e.StreamVersion)))
	return nil
}

// A batch read ahead while the previous one was processed must not be used
// when that processing wrote a dead letter: its dead-letter counts are
// stale, and a later event of the parked stream would be delivered out of
// order (ParkStream). The engine reads it again.
func TestReadAheadAfterDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// Batches of 2: (s1 v1, s2 v1), (s1 v2, s2 v2).
	for _, s := range []string{"s1", "s2", "s1", "s2"} {
		if _, err := b.store.Append(ctx, s, eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
			t.Fatal(err)
		}
	}
	p := &readAheadProjection{pool: b.db.Pool, base: b.db.Pool.Stat().AcquireCount()}
	r, err := projection.NewRunner(b.db.Pool, &projection.Config{Retry: &projection.RetryPolicy{MaxRetries: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(p, &projection.Options{BatchSize: 2}); err != nil {
		t.Fatal(err)
	}
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	seen := append([]string(nil), p.seen...)
	p.mu.Unlock()
	if len(seen) != 2 || seen[0] != "s2/1" || seen[1] != "s2/2" {
		t.Fatalf("handled %v, want [s2/1 s2/2]: s1/2 is parked behind s1/1's dead letter", seen)
	}
	rows, err := b.db.Pool.Query(ctx, `SELECT stream_id || '/' || reason FROM annals.dead_letters WHERE subscriber_id = 'readahead' ORDER BY global_sequence`)
	if err != nil {
		t.Fatal(err)
	}
	dl, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(dl) != 2 || dl[0] != "s1/failed" || dl[1] != "s1/parked" {
		t.Fatalf("dead letters %v, want [s1/failed s1/parked]", dl)
	}
}
