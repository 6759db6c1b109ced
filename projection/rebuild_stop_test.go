package projection_test

import (
	"context"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// rbFailing is rbProjection whose handler fails on the event at position
// failAt.
type rbFailing struct {
	*rbProjection
	failAt int64
}

func (p *rbFailing) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if e.GlobalSequence == p.failAt {
		return errors.Newf("cannot handle position %d", e.GlobalSequence)
	}
	return p.rbProjection.Handle(ctx, tx, e)
}

// TestRebuildStoppedByDeadLetterSaysWhatIsTrue: a rebuild that a dead letter
// stops (the Stop policy) fails with catchup.ErrStopped and says that the
// partition's replay waits for an operator's dlq retry or skip, not that a
// live instance continues it (none does until then).
func TestRebuildStoppedByDeadLetterSaysWhatIsTrue(t *testing.T) {
	t.Parallel()
	h := newRBHarness(t)
	h.fill(20, 5)
	p := &rbFailing{rbProjection: &rbProjection{name: "stopper", writer: "rebuild"}, failAt: 5}
	r := h.rebuilder("rebuild", p, &projection.Options{Types: []string{"rb.deposited"}, OnDeadLetter: projection.Stop,
		Retry: &projection.RetryPolicy{MaxRetries: -1}})
	err := r.Rebuild(t.Context(), "stopper", nil)
	if !errors.Is(err, catchup.ErrStopped) {
		t.Fatalf("Rebuild: %v; want ErrStopped", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "a live instance continues the replay") || !strings.Contains(msg, "annals dlq retry") ||
		!strings.Contains(msg, "annals dlq skip") {
		t.Fatalf("Rebuild's error does not say what resumes the replay: %v", err)
	}
}
