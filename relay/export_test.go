package relay

import "time"

// SetWALCheck sets how long a leadership's WAL source may take to start
// streaming before the relay looks into why, and a function receiving the
// verdict of each leadership (nil: not refused).
func SetWALCheck(r *Relay, timeout time.Duration, verdict func(error)) {
	r.walStartTimeout, r.onWALCheck = timeout, verdict
}
