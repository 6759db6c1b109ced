package catchup_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
)

// reached is a processor that records how far its batches went.
type reached struct {
	nopProcessor
	through atomic.Int64
}

func (p *reached) Process(_ context.Context, _ *catchup.Lease, b catchup.Batch) (int64, error) {
	p.through.Store(b.Through)
	return b.Through, nil
}

// A Drive whose ReadPool never shows its target (here a database holding
// the first 50 of the primary's 100 events, standing for a standby that
// lags, behind a pool that showed another one's head) fails with
// ErrReadPoolBehind after Config.ReadPoolWait, having replayed what the
// ReadPool shows; without ReadPoolWait it waits until its context ends.
func TestDriveReadPoolWait(t *testing.T) {
	t.Parallel()
	primary, stale := annalstest.NewDB(t, nil), annalstest.NewDB(t, nil)
	for db, n := range map[*annalstest.DB]int{primary: 100, stale: 50} {
		store, err := eventstore.New(db.Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		appendEvents(t, store, n)
	}
	ctx := t.Context()
	drive := func(wait, within time.Duration) (int64, time.Duration, error) {
		t.Helper()
		e, err := catchup.NewEngine(primary.Pool, nil, &catchup.Config{Owner: "rebuild", ReadPool: stale.Pool, ReadPoolWait: wait})
		if err != nil {
			t.Fatal(err)
		}
		p := &reached{}
		sub := &catchup.Subscription{Name: "rpw", Processor: p, BatchSize: 10}
		lease, err := e.TakeOver(ctx, sub, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Release(ctx, lease)
		dctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		start := time.Now()
		err = e.Drive(dctx, sub, lease, 100)
		return max(p.through.Load(), lease.Start), time.Since(start), err
	}
	at, took, err := drive(300*time.Millisecond, time.Minute)
	if !errors.Is(err, catchup.ErrReadPoolBehind) || at != 50 || took >= 30*time.Second {
		t.Fatalf("bounded: %v at %d after %s; want ErrReadPoolBehind at 50", err, at, took)
	}
	_, took, err = drive(0, 2*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unbounded: %v after %s; want the context's deadline", err, took)
	}
}
