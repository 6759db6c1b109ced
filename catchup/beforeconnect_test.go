package catchup_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/hookedpool"
)

// The engine's lock session and a pool listener log in through the pool's
// BeforeConnect, at each dial: a reconnect runs it again.
func TestPoolHooks(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)

	t.Run("LockSession", func(t *testing.T) {
		pool := hookedpool.New(t, db.URL, "hooked-engine").Pool
		var leading atomic.Bool
		e, err := catchup.NewEngine(pool, nil, &catchup.Config{PollInterval: 50 * time.Millisecond,
			OnLeadership: func(_ string, _ int, _ int64, l bool) { leading.Store(l) }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx, &catchup.Subscription{Name: "hooked", Processor: nopProcessor{}}) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
		annalstest.WaitFor(t, 10*time.Second, leading.Load)
	})

	t.Run("Listener", func(t *testing.T) {
		hp := hookedpool.New(t, db.URL, "hooked-listener")
		pool, before, after := hp.Pool, hp.Before, hp.After
		l, err := catchup.NewPoolListener(pool, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- l.Run(ctx) }()
		defer func() { cancel(); <-done }()
		listening := func() bool {
			select {
			case <-l.Listening():
				return true
			default:
				return false
			}
		}
		annalstest.WaitFor(t, 10*time.Second, listening)
		if before.Load() != 1 || after.Load() != 1 {
			t.Fatalf("one listener connection: BeforeConnect ran %d times, AfterConnect %d", before.Load(), after.Load())
		}
		if _, err := db.Pool.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'hooked-listener' AND datname = current_database()`); err != nil {
			t.Fatal(err)
		}
		annalstest.WaitFor(t, 10*time.Second, func() bool { return l.Reconnects() > 0 && listening() })
		if before.Load() != 2 || after.Load() != 2 {
			t.Fatalf("after a reconnect: BeforeConnect ran %d times, AfterConnect %d; want 2 and 2", before.Load(), after.Load())
		}
	})
}
