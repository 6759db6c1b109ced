package catchup

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
)

// annals.listener.reconnects (Listener.Reconnects) counts the times LISTEN
// was re-established, not the attempts: a connection lost, then three
// failed attempts and a successful one, is one reconnect. Each attempt used
// to count, so an outage of a minute read as some sixty reconnects.
func TestListenerCountsReconnectsThatListen(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	var (
		calls   atomic.Int32
		failing atomic.Int32 // attempts still to fail
		pid     atomic.Uint32
	)
	connect := func(ctx context.Context, cc *pgx.ConnConfig) (*pgx.Conn, error) {
		calls.Add(1)
		if failing.Load() > 0 {
			failing.Add(-1)
			return nil, errors.New("database down (test)")
		}
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err == nil {
			pid.Store(conn.PgConn().PID())
		}
		return conn, err
	}
	l, err := newListener(db.Pool.Config().ConnConfig, connect, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Run(lctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	listening := func() bool {
		select {
		case <-l.Listening():
			return true
		default:
			return false
		}
	}
	annalstest.WaitFor(t, 10*time.Second, listening)
	if n := l.Reconnects(); n != 0 {
		t.Fatalf("%d reconnects after the first LISTEN, want 0", n)
	}

	failing.Store(3)
	before := calls.Load()
	if _, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", int32(pid.Load())); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool { return calls.Load() >= before+4 && listening() })
	if n := l.Reconnects(); n != 1 {
		t.Fatalf("%d reconnects after one loss and %d attempts, want 1", n, calls.Load()-before)
	}
}
