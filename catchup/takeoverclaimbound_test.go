package catchup_test

import (
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
)

// TakeOver's wait bounds its claim of the checkpoint too: with the lock
// free but the checkpoint's row held by a long transaction, it ends with
// ErrTakeOverTimeout once the wait is over, instead of waiting as long as
// the row is held (its claim runs with the server's timeouts lifted).
func TestTakeOverWaitBoundsTheClaim(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	e, err := catchup.NewEngine(db.Pool, nil, &catchup.Config{Owner: "rebuild"})
	if err != nil {
		t.Fatal(err)
	}
	sub := &catchup.Subscription{Name: "s", Processor: nopProcessor{}}
	// The checkpoint's row exists, and a transaction holds it.
	lease, err := e.TakeOver(ctx, sub, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	e.Release(ctx, lease)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM annals.checkpoints WHERE subscriber_id = 's' AND partition = 0 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	const wait = time.Second
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		l, err := e.TakeOver(ctx, sub, wait)
		if err == nil {
			e.Release(ctx, l)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, catchup.ErrTakeOverTimeout) {
			t.Fatalf("TakeOver while the checkpoint's row is held: %v, want ErrTakeOverTimeout", err)
		}
		t.Logf("TakeOver gave up after %v: %v", time.Since(start), err)
	case <-time.After(30 * time.Second):
		t.Fatalf("TakeOver with a wait of %v still waits for the held row after 30 s", wait)
	}
}
