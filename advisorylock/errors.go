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

	// ErrPooledSession is matched by the error of a Standby's TryLock or
	// Take whose statement ran on another server session than the one the
	// Standby opened, of NewStandby, TryAcquire, Acquire and AcquireQueued
	// on a server session that holds advisory locks already, and of the
	// latter three when their lock statement ran on another server session
	// than the one they marked: a pooler in transaction or statement mode
	// (PgBouncer with ignore_startup_parameters, say) is between them and
	// PostgreSQL. Nothing was taken. Session locks need a direct connection
	// or a pooler in session mode; close the Standby.
	ErrPooledSession = errors.New("advisorylock: the lock session's statements run on other server sessions: " +
		"a pooler in transaction or statement mode is in between; session locks need a direct connection to PostgreSQL " +
		"or a pooler in session mode; locks taken before this was seen can stay on the pooler's server sessions until it closes them " +
		"(PgBouncer: RECONNECT on its admin console; see docs/operations.md, \"PgBouncer and other poolers\")")

	// ErrReleased is matched by Lock.Err and by the errors of Do and Verify
	// after Release.
	ErrReleased = errors.New("advisory lock released")
)
