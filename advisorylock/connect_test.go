package advisorylock_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
)

// Config.Connect opens every connection, with the lock's settings, and may
// change them (here: the user name, as a pool's BeforeConnect supplies a
// rotating credential): a connConfig whose user does not exist works.
func TestConfigConnect(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx := t.Context()
	placeholder := b.cc.Copy()
	placeholder.User = "annals_no_such_role"
	var dials atomic.Int64
	cfg := &advisorylock.Config{Connect: func(ctx context.Context, cc *pgx.ConnConfig) (*pgx.Conn, error) {
		dials.Add(1)
		if cc.RuntimeParams["tcp_keepalives_idle"] == "" || cc.DialFunc == nil {
			return nil, errors.New("Connect was not given the lock's settings")
		}
		cc.User = b.cc.User
		return pgx.ConnectConfig(ctx, cc)
	}}

	t.Run("WithoutConnectTheLoginFails", func(t *testing.T) {
		if _, err := advisorylock.TryAcquire(ctx, placeholder, "connect:none", nil); err == nil {
			t.Fatal("TryAcquire with a user that does not exist succeeded")
		}
	})
	t.Run("TryAcquire", func(t *testing.T) {
		l, err := advisorylock.TryAcquire(ctx, placeholder, "connect:try", cfg)
		if err != nil {
			t.Fatalf("TryAcquire: %+v", err)
		}
		defer l.Release(ctx)
		b.notAcquired(t, "connect:try")
		if placeholder.User != "annals_no_such_role" {
			t.Fatalf("connConfig changed: user %q", placeholder.User)
		}
	})
	t.Run("Acquire", func(t *testing.T) {
		l, err := advisorylock.Acquire(ctx, placeholder, "connect:acquire", cfg)
		if err != nil {
			t.Fatalf("Acquire: %+v", err)
		}
		defer l.Release(ctx)
		b.notAcquired(t, "connect:acquire")
	})
	t.Run("Standby", func(t *testing.T) {
		sb, err := advisorylock.NewStandby(ctx, placeholder, cfg)
		if err != nil {
			t.Fatalf("NewStandby: %+v", err)
		}
		defer sb.Close(ctx)
		if won, err := sb.Take(ctx, []string{"connect:standby"}); err != nil || len(won) != 1 {
			t.Fatalf("Take = %v, %v", won, err)
		}
		b.notAcquired(t, "connect:standby")
	})
	if n := dials.Load(); n != 3 {
		t.Fatalf("Connect called %d times for three connections", n)
	}
}
