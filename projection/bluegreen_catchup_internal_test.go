package projection

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/annals-dev/annals/catchup"
)

// ctxProcessor records whether the context of each call had ended.
type ctxProcessor struct {
	catchup.Processor
	ended []bool
}

func (p *ctxProcessor) Start(ctx context.Context, _ *catchup.Lease) error {
	p.ended = append(p.ended, ctx.Err() != nil)
	return nil
}

func (p *ctxProcessor) Process(ctx context.Context, _ *catchup.Lease, b catchup.Batch) (int64, error) {
	p.ended = append(p.ended, ctx.Err() != nil)
	return b.Through, nil
}

func (p *ctxProcessor) Redeliver(ctx context.Context, _ *catchup.Lease) error {
	p.ended = append(p.ended, ctx.Err() != nil)
	return nil
}

// The cut-over's catch-up in a rebuild ends with its deadline between
// batches, not in one: a batch's statements run on the session holding
// the partition's lock, and one cut off by the deadline closed it, which
// lost the lock and failed the rebuild. The processors run under the
// rebuild's context, put in the drive's.
func TestBatchCtxProcessorOutlivesTheDrive(t *testing.T) {
	inner := &ctxProcessor{}
	p := &batchCtxProcessor{inner}
	drive, cancel := context.WithTimeout(context.WithValue(t.Context(), batchCtxKey{}, t.Context()), time.Nanosecond)
	defer cancel()
	<-drive.Done()
	lease := &catchup.Lease{}
	_ = p.Start(drive, lease)
	_, _ = p.Process(drive, lease, catchup.Batch{})
	_ = p.Redeliver(drive, lease)
	for i, ended := range inner.ended {
		if ended {
			t.Errorf("call %d ran under the drive's ended context", i)
		}
	}
	// Without the key (settle, approach): the drive's context.
	inner.ended = nil
	plain, cancel := context.WithCancel(t.Context())
	cancel()
	_, _ = p.Process(plain, lease, catchup.Batch{})
	if len(inner.ended) != 1 || !inner.ended[0] {
		t.Error("a batch outside the cut-over did not run under the drive's context")
	}
}

// The pace a rebuild measured says how long the cut-over's catch-up of a
// gap would take; none measured, it says nothing.
func TestReplayPace(t *testing.T) {
	var p replayPace
	if _, ok := p.estimate(100); ok {
		t.Fatal("an estimate before any drive")
	}
	p = replayPace{positions: 1000, took: 2 * time.Second}
	if d, ok := p.estimate(250); !ok || d != 500*time.Millisecond {
		t.Fatalf("250 positions at 1000 per 2s: %v %v, want 500ms", d, ok)
	}
	// A pace of hours a position (handler retry delays) over a large gap
	// overflows int64 nanoseconds: clamped, never negative.
	p = replayPace{positions: 1, took: 10 * time.Hour}
	if d, ok := p.estimate(5_000_000); !ok || d != time.Duration(math.MaxInt64) {
		t.Fatalf("5M positions at 10h each: %v %v, want the longest duration", d, ok)
	}
	if lowest([]*catchup.Lease{{Start: 7}, {Start: 3}, {Start: 9}}) != 3 || lowest(nil) != 0 {
		t.Fatal("lowest start of leases")
	}
}
