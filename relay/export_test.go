package relay

import "time"

// SetWALCheck sets how long a leadership's WAL source may take to start
// streaming before the relay looks into why, and a function receiving the
// verdict of each leadership (nil: not refused).
func SetWALCheck(r *Relay, timeout time.Duration, verdict func(error)) {
	r.walStartTimeout, r.onWALCheck = timeout, verdict
}

// SetOnStarted sets a function called at the end of each leadership's
// successful start, once the relay has read its stream.
func SetOnStarted(r *Relay, f func()) { r.onStarted = f }

// PermissionViolation is permissionViolation.
var PermissionViolation = permissionViolation
