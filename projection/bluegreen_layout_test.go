package projection_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/projection"
)

// TestBlueGreenLayoutChangedSameVersion: a blue/green projection deployed
// with another partition count but the same BlueGreen.Version is refused
// by Run and RunUntilCaughtUp at once, with the *catchup.PartitionLayoutError
// and the advice that fits blue/green (raise the version), instead of Run
// running nothing and returning nil when it ends.
func TestBlueGreenLayoutChangedSameVersion(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	runner := func(id string, parts int) *projection.Runner {
		r, err := projection.NewRunner(db.Pool, &projection.Config{
			InstanceID: id, PollInterval: 100 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
			ShutdownTimeout: 5 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(statsProjection(1), &projection.Options{Partitions: parts, BlueGreen: &projection.BlueGreen{
			Version: 1, CheckInterval: 100 * time.Millisecond,
		}}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if err := runner("setup", 2).RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := log.add(ctx, 10, 3); err != nil {
		t.Fatal(err)
	}
	if err := runner("v1", 2).RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}

	check := func(what string, err error) {
		t.Helper()
		var le *catchup.PartitionLayoutError
		if !errors.As(err, &le) || !errors.Is(err, catchup.ErrPartitionLayout) {
			t.Fatalf("%s: %v; want a *catchup.PartitionLayoutError", what, err)
		}
		if le.Subscriber != "bgstats#g1" || le.Partitions != 4 || le.RecordedPartitions != 2 {
			t.Fatalf("%s: %+v", what, le)
		}
		if !strings.Contains(err.Error(), "raise BlueGreen.Version (to 2)") {
			t.Fatalf("%s: the error does not say how to change a blue/green layout: %v", what, err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	check("Run", runner("v1-4", 4).Run(rctx))
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Run refused after %s; want at once", d)
	}
	check("RunUntilCaughtUp", runner("v1-4b", 4).RunUntilCaughtUp(rctx))
	// The same layout still runs.
	if err := runner("v1-again", 2).RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	readerSees(t, db, log, 1)
}
