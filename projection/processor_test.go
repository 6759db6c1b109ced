package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/projection"
)

// countingProcessor commits each batch's Through on the lease and counts
// the events it got.
type countingProcessor struct{ events *int }

func (p countingProcessor) Start(context.Context, *catchup.Lease) error     { return nil }
func (p countingProcessor) Redeliver(context.Context, *catchup.Lease) error { return nil }
func (p countingProcessor) Idle(context.Context, *catchup.Lease) error      { return nil }
func (p countingProcessor) End(context.Context, *catchup.Lease) error       { return nil }

func (p countingProcessor) Process(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (int64, error) {
	*p.events += len(b.Events)
	err := lease.Lock.Do(ctx, func(conn *pgx.Conn) error { return lease.Commit(ctx, conn, b.Through) })
	return b.Through, err
}

// TestRegisterProcessor: a caller's catchup.Processor runs under the
// runner's election and checkpoints, filtered by Types; bad registrations
// are refused.
func TestRegisterProcessor(t *testing.T) {
	t.Parallel()
	h := newLiveHarness(t)
	h.appendEvents(40, 4)
	r, err := projection.NewRunner(h.pool, testConfig(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	newProc := func() catchup.Processor { return countingProcessor{events: &n} }
	for _, c := range []struct {
		name string
		proc func() catchup.Processor
		opts *projection.Options
	}{
		{"", newProc, nil},
		{"p", nil, nil},
		{"p", newProc, &projection.Options{Types: []string{"a**["}}},
		{"p", newProc, &projection.Options{BatchSize: -1}},
	} {
		if err := r.RegisterProcessor(c.name, c.proc, c.opts); err == nil {
			t.Errorf("RegisterProcessor(%q, %v) accepted", c.name, c.opts)
		}
	}
	if err := r.RegisterProcessor("counter", newProc, &projection.Options{BatchSize: 7}); err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterProcessor("counter", newProc, nil); err == nil {
		t.Fatal("a second registration of the name was accepted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if n != 40 || h.checkpoint("counter") != 40 {
		t.Fatalf("%d events processed, checkpoint %d; want 40 and 40", n, h.checkpoint("counter"))
	}
}
