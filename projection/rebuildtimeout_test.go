package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// rbSleeper is rbProjection whose handler sleeps in a statement for the
// event at position sleepAt.
type rbSleeper struct {
	*rbProjection
	sleepAt int64
}

func (p *rbSleeper) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if e.GlobalSequence == p.sleepAt {
		_, err := tx.Exec(ctx, `SELECT pg_sleep(10)`)
		return err
	}
	return p.rbProjection.Handle(ctx, tx, e)
}

// A handler's statement that outlives HandlerTimeout during a rebuild is a
// failed attempt, and the lock survives it (docs/guarantees.md, item 7). A
// rebuild's lease runs its batches on its lock's own connection, where
// pgx's default would close the connection at the timeout and lose the
// lock: the rebuild would then restart leadership on the same event instead
// of counting attempts. The rebuild ends with the event dead-lettered after
// its two attempts and every other event applied once.
func TestRebuildHandlerTimeoutKeepsTheLock(t *testing.T) {
	t.Parallel()
	h := newRBHarness(t)
	h.fill(20, 5)
	sleepAt := h.queryInt(`SELECT global_sequence FROM annals.events WHERE event_type = 'rb.deposited' ORDER BY global_sequence OFFSET 6 LIMIT 1`)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p := &rbSleeper{rbProjection: &rbProjection{name: "sleeper", writer: "rebuild"}, sleepAt: sleepAt}
	r := h.rebuilder("rebuild", p, &projection.Options{Types: []string{"rb.deposited"}, HandlerTimeout: 200 * time.Millisecond,
		OnDeadLetter: projection.SkipEvent, Retry: &projection.RetryPolicy{MaxRetries: 1, InitialDelay: 10 * time.Millisecond, Jitter: -1}})
	if err := r.Rebuild(ctx, "sleeper", nil); err != nil {
		t.Fatalf("Rebuild: %v", err)
	}
	var pos int64
	var attempts int
	if err := h.db.Pool.QueryRow(ctx, `SELECT global_sequence, attempts FROM annals.dead_letters WHERE subscriber_id = 'sleeper'`).Scan(&pos, &attempts); err != nil ||
		pos != sleepAt || attempts != 2 {
		t.Fatalf("dead letter at %d with %d attempts (%v), want %d with 2", pos, attempts, err, sleepAt)
	}
	if n, wrong := h.queryInt(`SELECT count(*) FROM rb_applied`), h.queryInt(`
		SELECT count(*) FROM (
		  SELECT event_id FROM annals.events WHERE event_type = 'rb.deposited' AND global_sequence <> $1
		  EXCEPT SELECT event_id FROM rb_applied WHERE n = 1) missing`, sleepAt); n != 19 || wrong != 0 {
		t.Fatalf("%d events applied, %d others missing or applied more than once; want the 19 others, once each", n, wrong)
	}
}
