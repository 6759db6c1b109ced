package catchup_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
)

// cancelling cancels the drive's context in its first batch and records
// whether that batch's context had ended once it had.
type cancelling struct {
	nopProcessor
	cancel  context.CancelFunc
	batches int
	ended   bool
}

func (p *cancelling) Process(ctx context.Context, _ *catchup.Lease, b catchup.Batch) (int64, error) {
	p.batches++
	p.cancel()
	p.ended = ctx.Err() != nil
	return b.Through, nil
}

// DriveWithin ends with its context between batches: the batch under way
// when it ends runs on under the processors' context (a statement of it
// cut off would close the TakeOver lease's session, and the lock with
// it), and no batch starts after it.
func TestDriveWithinEndsBetweenBatches(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	appendEvents(t, store, 100)
	e, err := catchup.NewEngine(db.Pool, nil, &catchup.Config{Owner: "rebuild"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, within := range []bool{true, false} {
		p := &cancelling{}
		sub := &catchup.Subscription{Name: "dw", Processor: p, BatchSize: 10}
		lease, err := e.TakeOver(ctx, sub, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		drive, cancel := context.WithCancel(ctx)
		p.cancel = cancel
		if within {
			err = e.DriveWithin(drive, ctx, sub, lease, 100)
		} else {
			err = e.Drive(drive, sub, lease, 100)
		}
		e.Release(ctx, lease)
		if !errors.Is(err, context.Canceled) || p.batches != 1 {
			t.Fatalf("within %v: %v after %d batches; want context.Canceled after 1", within, err, p.batches)
		}
		if p.ended == within {
			t.Fatalf("within %v: the batch's context ended with the drive's: %v", within, p.ended)
		}
	}
}
