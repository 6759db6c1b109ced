//go:build linux

package advisorylock

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"

	"github.com/annals-dev/annals/annalstest"
)

// TestClientSocketOptions checks the client side of the keepalive and user
// timeout settings on the lock's socket.
func TestClientSocketOptions(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	cc, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	// Plain TCP, whatever the URL prefers: TLS would hide the socket.
	cc.TLSConfig = nil
	var plain []*pgconn.FallbackConfig
	for _, f := range cc.Fallbacks {
		if f.TLSConfig == nil {
			plain = append(plain, f)
		}
	}
	cc.Fallbacks = plain
	for _, c := range []struct {
		name                       string
		cfg                        *Config
		idle, interval, count, utm int
	}{
		{"Defaults", nil, 5, 2, 3, 10000},
		{"Custom", &Config{KeepAliveIdle: 9 * time.Second, KeepAliveInterval: time.Second, KeepAliveCount: 7, UserTimeout: 2500 * time.Millisecond}, 9, 1, 7, 2500},
	} {
		l, err := TryAcquire(t.Context(), cc, "sockopt "+c.name, c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Release(context.Background()) })
		tcp, ok := l.sock.(*net.TCPConn)
		if !ok {
			// The harness's servers are reached over plain TCP; a TLS or Unix
			// socket URL in ANNALS_TEST_DATABASE_URL cannot test this.
			t.Fatalf("the lock's connection is a %T, not plain TCP: point ANNALS_TEST_DATABASE_URL at host:port with sslmode=disable", l.sock)
		}
		raw, err := tcp.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		get := func(level, opt int) int {
			var v int
			var gerr error
			if err := raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), level, opt) }); err != nil {
				t.Fatal(err)
			}
			if gerr != nil {
				t.Fatal(gerr)
			}
			return v
		}
		for _, o := range []struct {
			name       string
			level, opt int
			want       int
		}{
			{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
			{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, c.idle},
			{"TCP_KEEPINTVL", unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, c.interval},
			{"TCP_KEEPCNT", unix.IPPROTO_TCP, unix.TCP_KEEPCNT, c.count},
			{"TCP_USER_TIMEOUT", unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, c.utm},
		} {
			if got := get(o.level, o.opt); got != o.want {
				t.Errorf("%s: %s = %d, want %d", c.name, o.name, got, o.want)
			}
		}
	}
}
