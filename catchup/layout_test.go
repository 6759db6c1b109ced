package catchup_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
)

// A subscriber keeps the partition layout of its first run: run with
// another count or key, every entry point refuses it before it claims or
// delivers anything (the events would land in partitions whose checkpoints
// were written for others: skipped or repeated). A subscriber that ran
// before layouts were recorded is judged by its checkpoints.
func TestPartitionLayout(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"a-1", "b-2", "c-3", "d-4"} {
		if _, err := store.Append(ctx, s, eventstore.NoStream, eventstore.EventData{Type: "x.happened", Data: map[string]int{"i": 1}}); err != nil {
			t.Fatal(err)
		}
	}
	e, err := catchup.NewEngine(db.Pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	head, err := e.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	delivered := 0
	sub := func(name string, part, parts int, by string) *catchup.Subscription {
		return &catchup.Subscription{Name: name, Partition: part, Partitions: parts, PartitionBy: by,
			Processor: counter{mu: &mu, n: &delivered, db: db.Pool}}
	}
	run := func(name string, parts int, by string) error {
		for p := range max(parts, 1) {
			if err := e.CatchUp(ctx, sub(name, p, parts, by), head); err != nil {
				return err
			}
		}
		return nil
	}
	refused := func(t *testing.T, err error, want catchup.PartitionLayoutError) {
		t.Helper()
		var le *catchup.PartitionLayoutError
		if !errors.Is(err, catchup.ErrPartitionLayout) || !errors.As(err, &le) {
			t.Fatalf("err = %v, want a PartitionLayoutError", err)
		}
		if *le != want {
			t.Fatalf("refused with %+v, want %+v", *le, want)
		}
		t.Log(err)
	}

	if err := run("orders", 2, ""); err != nil {
		t.Fatal(err)
	}
	if delivered != int(head) {
		t.Fatalf("%d events delivered, want %d", delivered, head)
	}
	cps := checkpoints(t, db, "orders")

	// Every entry point, in a fresh engine too (no cached check).
	fresh, err := catchup.NewEngine(db.Pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	more := catchup.PartitionLayoutError{Subscriber: "orders", Partitions: 4, PartitionBy: "stream",
		RecordedPartitions: 2, RecordedPartitionBy: "stream", HighestPartition: -1}
	refused(t, run("orders", 4, ""), more)
	refused(t, fresh.CatchUp(ctx, sub("orders", 0, 4, ""), head), more)
	_, err = fresh.TakeOver(ctx, sub("orders", 1, 4, ""), time.Second)
	refused(t, err, more)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	refused(t, fresh.Run(rctx, sub("orders", 3, 4, "")), more) // returns at once, not at the deadline
	if rctx.Err() != nil {
		t.Fatal("Run waited for its context instead of refusing")
	}
	refused(t, fresh.CheckLayout(ctx, sub("orders", 0, 1, "")), catchup.PartitionLayoutError{Subscriber: "orders",
		Partitions: 1, PartitionBy: "stream", RecordedPartitions: 2, RecordedPartitionBy: "stream", HighestPartition: -1})
	refused(t, run("orders", 2, catchup.PartitionByCategory), catchup.PartitionLayoutError{Subscriber: "orders",
		Partitions: 2, PartitionBy: "category", RecordedPartitions: 2, RecordedPartitionBy: "stream", HighestPartition: -1})
	if delivered != int(head) {
		t.Fatalf("refused runs delivered %d events", delivered-int(head))
	}
	if got := checkpoints(t, db, "orders"); len(got) != len(cps) || got[0] != cps[0] || got[1] != cps[1] {
		t.Fatalf("refused runs moved or created checkpoints: %v, before %v", got, cps)
	}
	// The same layout runs, also spelled differently ("" is "stream").
	if err := run("orders", 2, catchup.PartitionByStream); err != nil {
		t.Fatal(err)
	}

	// Unpartitioned: the key decides nothing, so it may change.
	if err := run("single", 1, catchup.PartitionByCategory); err != nil {
		t.Fatal(err)
	}
	if err := run("single", 0, ""); err != nil {
		t.Fatal(err)
	}
	refused(t, run("single", 3, ""), catchup.PartitionLayoutError{Subscriber: "single", Partitions: 3, PartitionBy: "stream",
		RecordedPartitions: 1, RecordedPartitionBy: "stream", HighestPartition: -1})

	// A subscriber that ran before layouts were recorded: checkpoints for
	// partitions 0-3, no layout. Its count was 4.
	schema := pgx.Identifier{db.Schema}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+schema+`.checkpoints (subscriber_id, partition, position)
		SELECT 'legacy', p, 1 FROM generate_series(0, 3) p`); err != nil {
		t.Fatal(err)
	}
	refused(t, run("legacy", 2, ""), catchup.PartitionLayoutError{Subscriber: "legacy", Partitions: 2, PartitionBy: "stream", HighestPartition: 3, Checkpoints: 4})
	refused(t, run("legacy", 8, ""), catchup.PartitionLayoutError{Subscriber: "legacy", Partitions: 8, PartitionBy: "stream", HighestPartition: 3, Checkpoints: 4})
	if err := run("legacy", 4, catchup.PartitionByCategory); err != nil {
		t.Fatal(err)
	}
	// From then on its layout is recorded, key and all.
	refused(t, run("legacy", 4, ""), catchup.PartitionLayoutError{Subscriber: "legacy", Partitions: 4, PartitionBy: "stream",
		RecordedPartitions: 4, RecordedPartitionBy: "category", HighestPartition: -1})
	// With a gap (a first run interrupted before it claimed partitions 0
	// and 1), only fewer partitions than the checkpoints show are refused.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+schema+`.checkpoints (subscriber_id, partition, position) VALUES ('gappy', 2, 1)`); err != nil {
		t.Fatal(err)
	}
	refused(t, run("gappy", 2, ""), catchup.PartitionLayoutError{Subscriber: "gappy", Partitions: 2, PartitionBy: "stream", HighestPartition: 2, Checkpoints: 1})
	if err := run("gappy", 5, ""); err != nil {
		t.Fatal(err)
	}

	// Nothing processed (every checkpoint at 0): a mistaken first run's
	// layout gives way to the next, and the old layout's leaders are fenced.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+schema+`.checkpoints (subscriber_id, partition, position, epoch)
		SELECT 'typo', p, 0, 7 FROM generate_series(0, 2) p`); err != nil {
		t.Fatal(err)
	}
	if err := e.CheckLayout(ctx, sub("typo", 0, 3, "")); err != nil {
		t.Fatal(err)
	}
	if err := e.CheckLayout(ctx, sub("typo", 0, 4, "")); err != nil {
		t.Fatalf("a new layout for a subscriber that processed nothing: %v", err)
	}
	var fenced bool
	if err := db.Pool.QueryRow(ctx, `SELECT bool_and(epoch = 8 AND owner IS NULL) FROM `+schema+`.checkpoints WHERE subscriber_id = 'typo'`).Scan(&fenced); err != nil || !fenced {
		t.Fatalf("the old layout's checkpoints were not fenced (%v)", err)
	}

	// Ephemeral subscriptions keep no checkpoint: no layout either.
	eph := sub("orders", 0, 4, "")
	eph.Ephemeral = true
	if err := e.CatchUp(ctx, eph, head); err != nil {
		t.Fatal(err)
	}
}

// counter counts the events delivered, and commits the checkpoint.
type counter struct {
	nopProcessor
	mu *sync.Mutex
	n  *int
	db checkpoint.DB
}

func (c counter) Process(ctx context.Context, l *catchup.Lease, b catchup.Batch) (int64, error) {
	c.mu.Lock()
	*c.n += len(b.Events)
	c.mu.Unlock()
	if len(b.Events) > 0 {
		if err := l.Commit(ctx, c.db, b.Through); err != nil {
			return 0, err
		}
	}
	return b.Through, nil
}

// checkpoints returns the subscriber's checkpoint positions by partition.
func checkpoints(t *testing.T, db *annalstest.DB, sub string) []int64 {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `SELECT position FROM `+pgx.Identifier{db.Schema}.Sanitize()+
		`.checkpoints WHERE subscriber_id = $1 ORDER BY partition`, sub)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return ps
}
