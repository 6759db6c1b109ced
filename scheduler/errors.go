package scheduler

import "github.com/cockroachdb/errors"

var (
	// ErrInvalidTimer is matched by every rejection of a timer's input (a
	// zero due time or one outside the years 1 to 9999, an owner that is not
	// valid UTF-8, holds a control character or is over MaxOwnerBytes; for
	// CancelOwned, an empty owner, or one not valid UTF-8 or with NUL). An
	// append that
	// eventstore.Encode rejects (empty stream ID, no events, bad JSON, unknown
	// type), or whose events hold a number that PostgreSQL's jsonb cannot
	// hold (beyond numeric's range, such as 1e200000) in metadata, or in
	// data holding "$personal" or a \u escape, which the append refuses (an
	// *eventstore.InvalidEventError naming the event and the field), matches
	// both ErrInvalidTimer and eventstore.ErrInvalidEvent (or
	// eventstore.ErrUnknownEventType). Nothing is stored.
	ErrInvalidTimer = errors.New("invalid timer")

	// ErrTimerBusy is returned by Cancel and CancelOwned when a dispatcher
	// that is firing the timer holds it and did not let go in time: within
	// Config.ClaimTimeout, or at all because it waits for a lock that the
	// caller's transaction holds (the log's ordering lock, after an append
	// in that transaction: PostgreSQL reports the deadlock after its
	// deadlock_timeout, 1 s by default), or because the caller's transaction
	// is REPEATABLE READ or SERIALIZABLE and the dispatcher fired or retried
	// the timer meanwhile (a serialization failure). Nothing was cancelled, and the
	// caller's transaction is still usable (the attempt is rolled back to a
	// savepoint); the timer fires when the dispatcher goes on, unless its
	// append fails. To cancel it for sure, roll the transaction back and
	// try again.
	ErrTimerBusy = errors.New("timer is being fired")

	// ErrInvalidTask is matched by every rejection of a cron task definition:
	// an empty name or stream ID, a cron expression that does not parse or
	// never fires, an @every interval that is not a whole number of seconds
	// of at least one, an unknown time zone, an unknown missed-tick policy.
	// Nothing is stored.
	ErrInvalidTask = errors.New("invalid cron task")

	// ErrInvalidConfig is matched by every rejection of a Config by New: a
	// negative duration or count, a schema other than the store's, a
	// ClaimTimeout PostgreSQL cannot take (under 1 ms or over 2^31-1 ms).
	ErrInvalidConfig = errors.New("invalid scheduler config")

	// ErrUnknownTask is returned by PauseTask, ResumeTask and DeleteTask for
	// a name that has no task.
	ErrUnknownTask = errors.New("unknown cron task")
)
