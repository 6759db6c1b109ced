package annals_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/projection"
)

// Two clients, each with a pool of its own whose sessions default to
// REPEATABLE READ, set up the same inline projection at once: the first
// holds its setup until the second waits for the setup lock, and the
// second then finds the first one's record and runs nothing. The client
// begins its setup transactions READ COMMITTED; before, the second one's
// snapshot, taken before the wait, did not show the record, and it ran the
// setup again (and failed on its CREATE TABLE).
func TestClientInlineSetupUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	db := annalstest.NewDB(t, nil)
	db.SetDefaultIsolation(t, "repeatable read")
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[clDeposited](reg, "cl.deposited")
	var runs atomic.Int32
	p := projection.New("cl.rr_inline", reg)
	p.OnSetup(1, func(ctx context.Context, tx pgx.Tx) error {
		if runs.Add(1) == 1 {
			k1, k2 := lockkey.Pair(db.Schema + ":setup:cl.rr_inline")
			if err := annalstest.WaitForLockWaiter(ctx, db.Pool, k1, k2); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `CREATE TABLE cl_rr_inline (account text PRIMARY KEY)`)
		return err
	})
	projection.On(p, func(context.Context, pgx.Tx, eventstore.Envelope[clDeposited]) error { return nil })

	clients := make([]*annals.Client, 2)
	for i := range clients {
		var err error
		if clients[i], err = annals.New(db.NewPool(t), &annals.Config{Registry: reg, SkipMigrations: true,
			Inline: []eventstore.InlineProjection{p}}); err != nil {
			t.Fatal(err)
		}
		// RunUntilCaughtUp needs a subscriber in the runner: one of each
		// client's own, as the runner's catch-up under REPEATABLE READ is
		// not what this test is about.
		noop := projection.New(fmt.Sprintf("cl.rr_noop_%d", i), reg)
		projection.On(noop, func(context.Context, pgx.Tx, eventstore.Envelope[clDeposited]) error { return nil })
		if err := annals.AddProjection(clients[i], noop, nil); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(clients))
	for i, c := range clients {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.RunUntilCaughtUp(ctx) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("client %d: %v", i, err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the inline setup ran %d times; want once", n)
	}
}
