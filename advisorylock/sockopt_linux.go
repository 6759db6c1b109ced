//go:build linux

package advisorylock

import (
	"net"
	"time"

	"github.com/cockroachdb/errors"
	"golang.org/x/sys/unix"
)

// setUserTimeout sets TCP_USER_TIMEOUT on c: how long sent data may stay
// unacknowledged before the kernel drops the connection.
func setUserTimeout(c *net.TCPConn, d time.Duration) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return errors.Wrap(err, "TCP_USER_TIMEOUT")
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	}); err != nil {
		return errors.Wrap(err, "TCP_USER_TIMEOUT")
	}
	return errors.Wrap(serr, "TCP_USER_TIMEOUT")
}
