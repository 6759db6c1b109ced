package catchup_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
)

// hookedPool returns a pool whose login comes from BeforeConnect (as an
// IAM token would): its ConnConfig names a user that does not exist. Its
// sessions carry name as application_name. before counts BeforeConnect's
// calls, after AfterConnect's.
func hookedPool(t *testing.T, db *annalstest.DB, name string) (pool *pgxpool.Pool, before, after *atomic.Int64) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	user := cfg.ConnConfig.User
	cfg.ConnConfig.User = "annals_placeholder_role"
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	before, after = new(atomic.Int64), new(atomic.Int64)
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		before.Add(1)
		cc.User = user
		return nil
	}
	cfg.AfterConnect = func(context.Context, *pgx.Conn) error {
		after.Add(1)
		return nil
	}
	pool, err = pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, before, after
}

// The engine's lock session and a pool listener log in through the pool's
// BeforeConnect, at each dial: a reconnect runs it again.
func TestPoolHooks(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)

	t.Run("LockSession", func(t *testing.T) {
		pool, _, _ := hookedPool(t, db, "hooked-engine")
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
		pool, before, after := hookedPool(t, db, "hooked-listener")
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
		if _, err := db.Pool.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'hooked-listener'`); err != nil {
			t.Fatal(err)
		}
		annalstest.WaitFor(t, 10*time.Second, func() bool { return l.Reconnects() > 0 && listening() })
		if before.Load() != 2 || after.Load() != 2 {
			t.Fatalf("after a reconnect: BeforeConnect ran %d times, AfterConnect %d; want 2 and 2", before.Load(), after.Load())
		}
	})
}
