package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// TestRunnerRefusesAnotherPartitionLayout: a projection redeployed with
// another partition count (or key) would skip and repeat events; Run and
// RunUntilCaughtUp refuse to start it instead, and say why.
func TestRunnerRefusesAnotherPartitionLayout(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, `SELECT `+pgx.Identifier{db.Schema}.Sanitize()+
		`.append_events('order-1', 0, '[{"type": "bg.counted", "data": {"v": 1}}]')`); err != nil {
		t.Fatal(err)
	}
	runner := func(parts int, by string) *projection.Runner {
		reg := eventstore.NewRegistry()
		eventstore.MustRegister[Counted](reg, "bg.counted")
		p := projection.New("layout", reg)
		projection.On(p, func(context.Context, pgx.Tx, eventstore.Envelope[Counted]) error { return nil })
		r, err := projection.NewRunner(db.Pool, &projection.Config{InstanceID: "layout", RetryBackoff: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(p, &projection.Options{Partitions: parts, PartitionBy: by}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if err := runner(2, "").RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		parts int
		by    string
	}{{3, ""}, {1, ""}, {2, catchup.PartitionByCategory}} {
		err := runner(tc.parts, tc.by).RunUntilCaughtUp(ctx)
		if !errors.Is(err, catchup.ErrPartitionLayout) {
			t.Fatalf("RunUntilCaughtUp with %d partitions by %q: %v, want ErrPartitionLayout", tc.parts, tc.by, err)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = runner(tc.parts, tc.by).Run(rctx)
		stillRunning := rctx.Err() != nil
		cancel()
		if !errors.Is(err, catchup.ErrPartitionLayout) || stillRunning {
			t.Fatalf("Run with %d partitions by %q: %v (ran until its deadline: %v), want ErrPartitionLayout at once", tc.parts, tc.by, err, stillRunning)
		}
		t.Log(err)
	}
	if err := runner(2, catchup.PartitionByStream).RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
}
