package advisorylock

import "github.com/cockroachdb/errors"

var (
	// ErrNotAcquired is matched (errors.Is) by the error TryAcquire returns
	// when another session holds the lock. It is the normal answer for a
	// standby: try again later.
	ErrNotAcquired = errors.New("advisory lock held by another session")

	// ErrLost is matched by Lock.Err, and by the errors of Do, Verify and
	// Release, once the lock's session no longer holds the lock: the
	// connection died, the backend was terminated, or the lock was unlocked
	// behind the Lock's back. The error wraps the cause.
	ErrLost = errors.New("advisory lock lost")

	// ErrReleased is matched by Lock.Err and by the errors of Do and Verify
	// after Release.
	ErrReleased = errors.New("advisory lock released")
)
