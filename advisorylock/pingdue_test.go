package advisorylock_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
)

// swallowConn is a client connection whose writes, once swallow is set,
// never reach the server (as on a path that stopped delivering): a
// statement sent then gets no answer. swallowed is closed at the first
// write it swallowed.
type swallowConn struct {
	net.Conn
	swallow   atomic.Bool
	once      sync.Once
	swallowed chan struct{}
}

func (c *swallowConn) Write(b []byte) (int, error) {
	if c.swallow.Load() {
		c.once.Do(func() { close(c.swallowed) })
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// acquireSwallowing takes key on a connection that can swallow its writes.
func (b *testBundle) acquireSwallowing(t *testing.T, key string, cfg *advisorylock.Config) (*advisorylock.Lock, *swallowConn) {
	t.Helper()
	cc := b.cc.Copy()
	var conn *swallowConn
	dial := cc.DialFunc
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn = &swallowConn{Conn: c, swallowed: make(chan struct{})}
		return conn, nil
	}
	l, err := advisorylock.TryAcquire(t.Context(), cc, key, cfg)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %+v", key, err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l, conn
}

// waitSwallowed waits for the watcher's next ping, which c swallows: it is
// then in flight, and gets no answer.
func waitSwallowed(t *testing.T, c *swallowConn, within time.Duration) {
	t.Helper()
	c.swallow.Store(true)
	select {
	case <-c.swallowed:
	case <-time.After(within):
		t.Fatalf("no ping within %v", within)
	}
}

// A ping in flight is not cut when Release stops the watcher (pgconn would
// close the connection), but Release's ctx still bounds the wait for its
// answer: when it ends, Release closes the connection, which frees the
// lock, as it does under a Do. Before, Release waited for the ping's
// answer or its timeout (at least 5 s; here the server ended the idle
// session FreezeTimeout after the last ping that reached it).
func TestReleaseDoesNotWaitForAnUnansweredPing(t *testing.T) {
	t.Parallel()
	const freeze = 3 * time.Second // a ping every second
	b := newBundle(t)
	l, c := b.acquireSwallowing(t, "ping:release", &advisorylock.Config{FreezeTimeout: freeze})
	waitSwallowed(t, c, freeze)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := l.Release(ctx)
	took := time.Since(start)
	if took > time.Second {
		t.Fatalf("Release with a 100ms context took %v while a ping was in flight", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release = %v; want its context's error", err)
	}
	if !errors.Is(l.Err(), advisorylock.ErrReleased) {
		t.Fatalf("Err after Release = %v; want ErrReleased", l.Err())
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return b.holderPID(t, "ping:release") == 0 })
	annalstest.WaitFor(t, 10*time.Second, func() bool { return advisorylock.Watchers(l) == 0 })
}

// Do's ctx bounds its wait for the connection, a ping in flight included:
// Do returns ctx's error, and the turn goes back once the ping is over (here
// it fails: the lock is lost, and a Do after that says so). Before, Do
// waited for the ping's answer or its timeout.
func TestDoDoesNotWaitForAnUnansweredPing(t *testing.T) {
	t.Parallel()
	const freeze = 3 * time.Second
	b := newBundle(t)
	l, c := b.acquireSwallowing(t, "ping:do", &advisorylock.Config{FreezeTimeout: freeze})
	waitSwallowed(t, c, freeze)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	called := false
	err := l.Do(ctx, func(*pgx.Conn) error { called = true; return nil })
	took := time.Since(start)
	if took > time.Second {
		t.Fatalf("Do with a 100ms context took %v while a ping was in flight", took)
	}
	if called || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do = %v (fn called: %v); want its context's error, fn not called", err, called)
	}
	waitLost(t, l) // the server ends the session, and the ping fails
	if err := l.Do(t.Context(), func(*pgx.Conn) error { return nil }); !errors.Is(err, advisorylock.ErrLost) {
		t.Fatalf("Do after the loss = %v; want ErrLost", err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return advisorylock.Watchers(l) == 0 })
}
