package projection_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// cutting is a projection that records, per event, the transaction that
// applied it; it asks for a commit after the events at positions in cutAfter
// and fails the event at failAt once.
type cutting struct {
	cutAfter map[int64]bool
	failAt   int64
	mu       sync.Mutex
	failed   bool
}

func (c *cutting) Name() string { return "cutting" }

func (c *cutting) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	c.mu.Lock()
	fail := e.GlobalSequence == c.failAt && !c.failed
	c.failed = c.failed || fail
	c.mu.Unlock()
	if fail {
		return errors.New("transient")
	}
	_, err := tx.Exec(ctx, `INSERT INTO cut_applied (pos, txid) VALUES ($1, txid_current())`, e.GlobalSequence)
	return err
}

func (c *cutting) CommitAfter(e eventstore.Event) bool { return c.cutAfter[e.GlobalSequence] }

// A CommitCutter's batch commits right after each event it names, with the
// checkpoint there; a failure later in the batch commits the events before
// it on their own, as without cuts; every event is applied exactly once.
func TestCommitCutter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE cut_applied (pos bigint PRIMARY KEY, txid bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	evs := make([]eventstore.EventData, 10)
	for i := range evs {
		evs[i] = eventstore.EventData{Type: "cut.ev", Data: map[string]int{"i": i}}
	}
	if _, err := store.Append(ctx, "s", eventstore.NoStream, evs...); err != nil {
		t.Fatal(err)
	}
	// Positions 1..10: cut after 3 and 6, fail 8 once.
	p := &cutting{cutAfter: map[int64]bool{3: true, 6: true}, failAt: 8}
	r, err := projection.NewRunner(db.Pool, &projection.Config{RetryBackoff: 10 * time.Millisecond,
		Retry: &projection.RetryPolicy{MaxRetries: 3, InitialDelay: time.Millisecond, Jitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(p, &projection.Options{BatchSize: 100}); err != nil {
		t.Fatal(err)
	}
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT string_agg(pos::text, ',' ORDER BY pos) FROM cut_applied GROUP BY txid ORDER BY min(pos)`)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	// 1-3 and 4-6 end at the cuts; 7 commits alone before the failing 8 is
	// retried; 8-10 commit together.
	if want := []string{"1,2,3", "4,5,6", "7", "8,9,10"}; !slices.Equal(groups, want) {
		t.Fatalf("events per transaction %v, want %v", groups, want)
	}
	var cp int64
	if err := db.Pool.QueryRow(ctx, `SELECT position FROM annals.checkpoints WHERE subscriber_id = 'cutting'`).Scan(&cp); err != nil || cp != 10 {
		t.Fatalf("checkpoint %d (%v), want 10", cp, err)
	}
}
