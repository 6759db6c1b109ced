package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// rbThinker is rbProjection whose handler works (no SQL) for think before
// its statement, for the event at position thinkAt.
type rbThinker struct {
	*rbProjection
	thinkAt int64
	think   time.Duration
}

func (p *rbThinker) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if e.GlobalSequence == p.thinkAt {
		// A call to another service, say: no statement on tx meanwhile.
		t := time.NewTimer(p.think)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	return p.rbProjection.Handle(ctx, tx, e)
}

// A rebuild's batches run on its lease's own lock connection, which has
// idle_session_timeout (the lock's FreezeTimeout) and which nothing pings
// while a batch runs. A handler that works longer than that before the
// batch's first statement (within its HandlerTimeout) must not leave the
// session idle outside a transaction, or the server ends it and the
// rebuild loses its lock: the batch's transaction is begun before the
// handlers run. Before, the lazily begun transaction left the session
// idle, and the rebuild failed with its lock lost.
func TestRebuildHandlerWorkBeforeItsFirstStatementKeepsTheLock(t *testing.T) {
	t.Parallel()
	const freeze = advisorylock.MinFreezeTimeout
	h := newRBHarness(t)
	h.fill(20, 5)
	thinkAt := h.queryInt(`SELECT min(global_sequence) FROM annals.events WHERE event_type = 'rb.deposited'`)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p := &rbThinker{rbProjection: &rbProjection{name: "thinker", writer: "rebuild"}, thinkAt: thinkAt, think: 3 * freeze}
	cfg := testConfig(100 * time.Millisecond)
	cfg.InstanceID = "rebuild"
	cfg.Lock = &advisorylock.Config{FreezeTimeout: freeze}
	r, err := projection.NewRunner(h.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(p, &projection.Options{Types: []string{"rb.deposited"}, HandlerTimeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := r.Rebuild(ctx, "thinker", nil); err != nil {
		t.Fatalf("Rebuild with a handler that works %v (FreezeTimeout %v) before its batch's first statement: %v", p.think, freeze, err)
	}
	if n, wrong := h.queryInt(`SELECT count(*) FROM rb_applied`), h.queryInt(`
		SELECT count(*) FROM (
		  SELECT event_id FROM annals.events WHERE event_type = 'rb.deposited'
		  EXCEPT SELECT event_id FROM rb_applied WHERE n = 1) missing`); n != 20 || wrong != 0 {
		t.Fatalf("%d events applied, %d missing or applied more than once; want 20, once each", n, wrong)
	}
}
