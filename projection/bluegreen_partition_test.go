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
