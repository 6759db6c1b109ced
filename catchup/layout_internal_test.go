package catchup

import (
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
)

// A claim is made only while the subscriber's recorded layout is the
// subscription's: an engine that checked the layout before another
// replaced it (a subscriber that processed nothing yet) cannot start a
// leader of the old layout.
func TestClaimChecksTheLayout(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	e, err := NewEngine(db.Pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	three := &Subscription{Name: "s", Partition: 1, Partitions: 3, Processor: nopLeader{}}
	four := &Subscription{Name: "s", Partition: 1, Partitions: 4, Processor: nopLeader{}}
	if err := e.CheckLayout(ctx, three); err != nil {
		t.Fatal(err)
	}
	if _, err := e.claimLaidOut(ctx, db.Pool, three); err != nil {
		t.Fatal(err)
	}
	if err := e.CheckLayout(ctx, four); err != nil { // nothing processed: replaced
		t.Fatal(err)
	}
	_, err = e.claimLaidOut(ctx, db.Pool, three)
	var le *PartitionLayoutError
	if !errors.As(err, &le) || le.RecordedPartitions != 4 || le.Partitions != 3 {
		t.Fatalf("claim under the replaced layout: %v, want a PartitionLayoutError naming 4 partitions", err)
	}
	cp, err := e.claimLaidOut(ctx, db.Pool, four)
	if err != nil {
		t.Fatal(err)
	}
	if cp.Epoch != 3 { // claimed, fenced by the replacement, claimed
		t.Fatalf("epoch %d, want 3", cp.Epoch)
	}
}
