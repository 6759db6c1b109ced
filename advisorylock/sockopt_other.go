//go:build !linux

package advisorylock

import (
	"net"
	"time"
)

// setUserTimeout does nothing: TCP_USER_TIMEOUT is Linux-only. The server
// side (tcp_user_timeout) is still set when the server runs on Linux.
func setUserTimeout(*net.TCPConn, time.Duration) error { return nil }
