package projection_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// TestBlueGreenPartitionBy: the generations of a blue/green projection are
// split by its PartitionBy, as the projection without BlueGreen is. (They
// were split by stream ID whatever PartitionBy said: a projection that
// relies on one leader per category saw a category's streams handled by
// several partitions at once.) Every event fails its handler once, so each
// becomes a dead letter that records the partition that handled it.
func TestBlueGreenPartitionBy(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	schema := pgx.Identifier{db.Schema}.Sanitize()

	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Counted](reg, "bg.counted")
	p := projection.New("bgpart", reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE unused (id int)`))
	projection.On(p, func(context.Context, pgx.Tx, eventstore.Envelope[Counted]) error {
		return errors.New("refused, so that the event's dead letter names its partition")
	})
	const partitions = 4
	r, err := projection.NewRunner(db.Pool, &projection.Config{
		InstanceID: "bgpart", PollInterval: 100 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(p, &projection.Options{
		Partitions: partitions, PartitionBy: catchup.PartitionByCategory,
		Retry:     &projection.RetryPolicy{MaxRetries: -1},
		BlueGreen: &projection.BlueGreen{Version: 1},
	}); err != nil {
		t.Fatal(err)
	}

	// Two categories, eight streams each: by stream ID they spread over
	// the partitions; by category each category has one.
	const streams = 8
	for _, cat := range []string{"order", "user"} {
		for i := range streams {
			if _, err := db.Pool.Exec(ctx, `SELECT `+schema+`.append_events($1, 0, '[{"type": "bg.counted", "data": {"v": 1}}]')`,
				fmt.Sprintf("%s-%d", cat, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}

	rows, err := db.Pool.Query(ctx, `SELECT stream_id, partition, `+schema+`.stream_partition(split_part(stream_id, '-', 1), $1),
			`+schema+`.stream_partition(stream_id, $1)
		  FROM `+schema+`.dead_letters WHERE subscriber_id LIKE 'bgpart#%' ORDER BY stream_id`, partitions)
	if err != nil {
		t.Fatal(err)
	}
	var stream string
	var got, byCategory, byStream int
	n, spread := 0, false
	if _, err := pgx.ForEachRow(rows, []any{&stream, &got, &byCategory, &byStream}, func() error {
		n++
		if got != byCategory {
			t.Errorf("%s was handled by partition %d; its category's partition is %d (its stream ID's %d)", stream, got, byCategory, byStream)
		}
		spread = spread || byStream != byCategory
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != 2*streams {
		t.Fatalf("%d dead letters, want %d", n, 2*streams)
	}
	if !spread {
		t.Fatal("every stream ID hashes to its category's partition: the test cannot tell the keys apart")
	}
}

// TestBlueGreenNewPartitionCount: the way to change a read model's
// partition count is a new blue/green version. The new generation is a new
// subscriber, recorded with the new layout, while processes of the old
// version keep running the live generation with its own; the cut-over
// gives readers a complete model of the new version.
func TestBlueGreenNewPartitionCount(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	runner := func(id string, version, parts int) *projection.Runner {
		r, err := projection.NewRunner(db.Pool, &projection.Config{
			InstanceID: id, PollInterval: 100 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
			ShutdownTimeout: 5 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(statsProjection(version), &projection.Options{Partitions: parts, BlueGreen: &projection.BlueGreen{
			Version: version, AutoRebuild: version > 1, CheckInterval: 100 * time.Millisecond,
		}}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if err := runner("v1-setup", 1, 2).RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := log.add(ctx, 30, 4); err != nil {
		t.Fatal(err)
	}
	bgRunInBackground(t, runner("v1", 1, 2))
	annalstest.WaitFor(t, 30*time.Second, func() bool { return checkpointOf(t, db, "bgstats#g1") >= headOf(t, db) })
	readerSees(t, db, log, 1)

	bgRunInBackground(t, runner("v2", 2, 4))
	if err := log.add(ctx, 10, 3); err != nil { // while both run
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 90*time.Second, func() bool {
		return state(t, db, 2) == projection.GenerationLive && checkpointOf(t, db, "bgstats#g2") >= headOf(t, db)
	})
	readerSees(t, db, log, 2)
	var layouts []string
	rows, err := db.Pool.Query(ctx, `SELECT subscriber_id || ':' || partitions FROM `+pgx.Identifier{db.Schema}.Sanitize()+
		`.subscriber_layouts WHERE subscriber_id LIKE 'bgstats#%' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	if layouts, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(layouts) != "[bgstats#g1:2 bgstats#g2:4]" {
		t.Fatalf("layouts %v, want g1 with 2 partitions and g2 with 4", layouts)
	}
}
