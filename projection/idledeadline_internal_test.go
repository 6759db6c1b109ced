package projection

import (
	"context"
	"testing"
	"time"

	"github.com/annals-dev/annals/catchup"
)

// deadlineProcessor is a catchup.Processor that implements
// catchup.IdleDeadliner with a fixed deadline.
type deadlineProcessor struct{ next time.Time }

func (deadlineProcessor) Start(context.Context, *catchup.Lease) error { return nil }
func (deadlineProcessor) Process(_ context.Context, _ *catchup.Lease, b catchup.Batch) (int64, error) {
	return b.Through, nil
}
func (deadlineProcessor) Redeliver(context.Context, *catchup.Lease) error { return nil }
func (deadlineProcessor) Idle(context.Context, *catchup.Lease) error      { return nil }
func (deadlineProcessor) End(context.Context, *catchup.Lease) error       { return nil }
func (p deadlineProcessor) NextIdle() time.Time                           { return p.next }

// plainProcessor is deadlineProcessor without NextIdle.
type plainProcessor struct{ catchup.Processor }

// TestWrappersForwardNextIdle: the processors that wrap another (a
// rebuild's counting, a blue/green generation's gate) pass its NextIdle on,
// so that the engine still ends an idle wait at the wrapped one's deadline
// (an observer's CheckpointInterval); embedding alone hid the method, and
// the wait lasted the poll interval. One that has none gives the zero time.
func TestWrappersForwardNextIdle(t *testing.T) {
	t.Parallel()
	due := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	wrappers := map[string]func(catchup.Processor) catchup.Processor{
		"countingProcessor": func(p catchup.Processor) catchup.Processor {
			return &countingProcessor{Processor: p, done: func(int) {}}
		},
		"gatedProcessor": func(p catchup.Processor) catchup.Processor { return &gatedProcessor{Processor: p} },
	}
	for name, wrap := range wrappers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d, ok := wrap(deadlineProcessor{next: due}).(catchup.IdleDeadliner)
			if !ok {
				t.Fatalf("%s does not implement catchup.IdleDeadliner", name)
			}
			if got := d.NextIdle(); !got.Equal(due) {
				t.Errorf("NextIdle() = %v, want the wrapped processor's %v", got, due)
			}
			d = wrap(plainProcessor{deadlineProcessor{}}).(catchup.IdleDeadliner)
			if got := d.NextIdle(); !got.IsZero() {
				t.Errorf("NextIdle() of a wrapped processor without one = %v, want zero", got)
			}
		})
	}
}
