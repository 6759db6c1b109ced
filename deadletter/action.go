package deadletter

import (
	"context"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
)

// Change reports what Retry, RetryAll or Skip did. Each is idempotent: a
// second call finds nothing left to do and reports no change.
type Change struct {
	// Was is the status the dead letter named in Retry or Skip had before
	// the call ("" for RetryAll). When it was not open (Retry) or was
	// already resolved or skipped (Skip), nothing changed.
	Was Status
	// Retried lists the dead letters marked for re-delivery (status retry),
	// in the order the runner re-delivers them (by partition, then position).
	Retried []int64
	// Skipped lists the dead letters marked skipped: the one Skip names,
	// and those in Gone.
	Skipped []int64
	// Gone lists the dead letters that were to be marked for re-delivery
	// but whose events no longer exist in the log (a hard delete and
	// scavenge, a truncation or retention removed them): nothing can
	// deliver them, so they were marked skipped instead (they are in
	// Skipped too), with "not delivered: the event no longer exists" in
	// front of their error. The operator is told; the rest of the stream
	// flows on without them.
	Gone []int64
	// Resumed lists the subscriber partitions halted by the Stop policy
	// whose halt was cleared, by partition.
	Resumed []Halt
}

// Changed reports whether anything changed.
func (c Change) Changed() bool {
	return len(c.Retried) > 0 || len(c.Skipped) > 0 || len(c.Resumed) > 0
}

// Halt is a subscriber partition halted by the Stop policy, as it was before
// an operator resumed it.
type Halt struct {
	Subscriber string
	Partition  int
	// Reason is the checkpoint's stopped_reason.
	Reason string
	// Since is when the runner halted it (zero if unknown).
	Since time.Time
}

// Retry releases the stream of an open dead letter: it marks every open
// dead letter of the same stream, subscriber and partition for re-delivery
// (status retry), so that the subscriber's runner re-delivers them in
// position order, and clears the partition's Stop if it is halted. Those
// whose events no longer exist in the log (scavenged) cannot be re-delivered:
// they are marked skipped instead and listed in Change.Gone. A dead
// letter that is not open (already retry, resolved or skipped) changes
// nothing; Change.Was says what it is. An unknown ID fails with ErrNotFound.
func (s *Store) Retry(ctx context.Context, id int64) (Change, error) {
	var c Change
	err := s.inTx(ctx, func(tx pgx.Tx) (err error) {
		c, err = s.RetryTx(ctx, tx, id)
		return err
	})
	return c, err
}

// RetryTx is Retry in the caller's transaction.
func (s *Store) RetryTx(ctx context.Context, tx pgx.Tx, id int64) (Change, error) {
	d, err := s.lock(ctx, tx, id)
	if err != nil {
		return Change{}, err
	}
	c := Change{Was: d.status}
	if d.status != StatusOpen {
		return c, nil
	}
	if err = s.release(ctx, tx, &c, d.subscriber, &d.partition, &d.stream); err != nil {
		return Change{}, errors.Wrapf(err, "deadletter: retry %d", id)
	}
	if c.Resumed, err = s.resume(ctx, tx, d.subscriber, &d.partition); err != nil {
		return Change{}, errors.Wrapf(err, "deadletter: retry %d", id)
	}
	return c, nil
}

// RetryAll marks every open dead letter of the subscriber, in every
// partition, for re-delivery, and clears the Stop of every halted partition
// of the subscriber (even one with no open dead letter: RetryAll is how an
// operator resumes a subscriber as a whole). Dead letters whose events no
// longer exist in the log are marked skipped instead (Change.Gone), as in
// Retry. A subscriber with neither dead letters nor a checkpoint fails with
// ErrNotFound (probably a typo).
func (s *Store) RetryAll(ctx context.Context, subscriber string) (Change, error) {
	var c Change
	err := s.inTx(ctx, func(tx pgx.Tx) (err error) {
		c, err = s.RetryAllTx(ctx, tx, subscriber)
		return err
	})
	return c, err
}

// RetryAllTx is RetryAll in the caller's transaction.
func (s *Store) RetryAllTx(ctx context.Context, tx pgx.Tx, subscriber string) (Change, error) {
	if subscriber == "" {
		return Change{}, errors.Wrap(ErrInvalid, "subscriber name is empty")
	}
	var c Change
	var err error
	if _, err = s.ids(ctx, tx, "LockOpen", subscriber); err != nil {
		return Change{}, errors.Wrapf(err, "deadletter: retry all of %s", subscriber)
	}
	if err = s.release(ctx, tx, &c, subscriber, nil, nil); err != nil {
		return Change{}, errors.Wrapf(err, "deadletter: retry all of %s", subscriber)
	}
	if c.Resumed, err = s.resume(ctx, tx, subscriber, nil); err != nil {
		return Change{}, errors.Wrapf(err, "deadletter: retry all of %s", subscriber)
	}
	if c.Changed() {
		return c, nil
	}
	var known bool
	if err := tx.QueryRow(ctx, s.q["SubscriberKnown"], subscriber).Scan(&known); err != nil {
		return Change{}, errors.Wrapf(err, "deadletter: retry all of %s", subscriber)
	}
	if !known {
		return Change{}, errors.Wrapf(ErrNotFound, "subscriber %q has no dead letters and no checkpoint", subscriber)
	}
	return c, nil
}

// Skip gives up on a dead letter: it is marked skipped (resolved without
// delivery), the other open dead letters of its stream for the same
// subscriber partition are marked for re-delivery (the stream flows on
// without the broken event; those whose events no longer exist in the log
// are skipped too, as in Retry: Change.Gone), and the partition's Stop is
// cleared. A dead letter in retry may be skipped too (before the runner re-delivers it);
// one already resolved or skipped changes nothing. An unknown ID fails with
// ErrNotFound.
//
// The runner holds a dead letter's row lock while it re-delivers it, so a
// Skip during a re-delivery waits for it (an observer's, for at most its
// handler timeout and a few seconds): when the handler succeeded, the entry is resolved and Skip
// changes nothing (Change.Was is StatusResolved: the event was delivered
// after all); when it failed, Skip skips it as usual. An entry reported
// skipped was never delivered.
func (s *Store) Skip(ctx context.Context, id int64) (Change, error) {
	var c Change
	err := s.inTx(ctx, func(tx pgx.Tx) (err error) {
		c, err = s.SkipTx(ctx, tx, id)
		return err
	})
	return c, err
}

// SkipTx is Skip in the caller's transaction.
func (s *Store) SkipTx(ctx context.Context, tx pgx.Tx, id int64) (Change, error) {
	d, err := s.lock(ctx, tx, id)
	if err != nil {
		return Change{}, err
	}
	c := Change{Was: d.status}
	if !d.status.Unresolved() {
		return c, nil
	}
	if _, err := tx.Exec(ctx, s.q["MarkSkipped"], id); err != nil {
		return Change{}, errors.Wrapf(err, "deadletter: skip %d", id)
	}
	c.Skipped = []int64{id}
	if err = s.release(ctx, tx, &c, d.subscriber, &d.partition, &d.stream); err != nil {
		return Change{}, errors.Wrapf(err, "deadletter: skip %d", id)
	}
	if c.Resumed, err = s.resume(ctx, tx, d.subscriber, &d.partition); err != nil {
		return Change{}, errors.Wrapf(err, "deadletter: skip %d", id)
	}
	return c, nil
}

// Purge deletes the dead letters last updated at or before olderThan (the
// cutoff is inclusive): only resolved and skipped ones, unless
// includeUnresolved, when open and retry ones go too. Deleting an
// unresolved dead letter releases its stream without re-delivering the
// event (like Skip, but leaving no trace) and does not resume a halted
// subscriber. It returns how many were deleted. A cutoff that is zero or
// outside the years 1 to 9999 (UTC) fails with ErrInvalid.
func (s *Store) Purge(ctx context.Context, olderThan time.Time, includeUnresolved bool) (int64, error) {
	var n int64
	err := s.inTx(ctx, func(tx pgx.Tx) (err error) {
		n, err = s.PurgeTx(ctx, tx, olderThan, includeUnresolved)
		return err
	})
	return n, err
}

// PurgeTx is Purge in the caller's transaction.
func (s *Store) PurgeTx(ctx context.Context, tx pgx.Tx, olderThan time.Time, includeUnresolved bool) (int64, error) {
	if olderThan.IsZero() {
		return 0, errors.Wrap(ErrInvalid, "purge cutoff is the zero time")
	}
	// pgx encodes a timestamptz in microseconds since 2000 in an int64 that
	// wraps around silently: a cutoff billions of years in the past could
	// reach the database as the year 2100 and purge everything.
	if y := olderThan.UTC().Year(); y < 1 || y > 9999 {
		return 0, errors.Wrapf(ErrInvalid, "purge cutoff %s: want a time in the years 1 to 9999", olderThan.UTC())
	}
	var n int64
	if err := tx.QueryRow(ctx, s.q["Purge"], olderThan, includeUnresolved).Scan(&n); err != nil {
		return 0, errors.Wrap(err, "deadletter: purge")
	}
	return n, nil
}

// locked is the dead letter an action holds the row lock of.
type locked struct {
	subscriber, stream string
	partition          int
	status             Status
}

func (s *Store) lock(ctx context.Context, tx pgx.Tx, id int64) (locked, error) {
	if err := validID(id); err != nil {
		return locked{}, err
	}
	rows, err := tx.Query(ctx, s.q["Lock"], id)
	if err != nil {
		return locked{}, errors.Wrapf(err, "deadletter: lock %d", id)
	}
	var d, row locked
	var rowID int64
	found := false
	_, err = pgx.ForEachRow(rows, []any{&rowID, &row.subscriber, &row.partition, &row.stream, &row.status}, func() error {
		if rowID == id {
			d, found = row, true
		}
		return nil
	})
	if err != nil {
		return locked{}, errors.Wrapf(err, "deadletter: lock %d", id)
	}
	if !found {
		return locked{}, notFound(id)
	}
	return d, nil
}

// ids runs a statement that returns dead-letter IDs.
func (s *Store) ids(ctx context.Context, tx pgx.Tx, query string, args ...any) ([]int64, error) {
	rows, err := tx.Query(ctx, s.q[query], args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// release marks for re-delivery the open dead letters of subscriber's
// stream in partition (both nil: of all its partitions) and adds what it
// did to c: the dead letters marked for re-delivery to Retried, those whose
// events are gone (marked skipped instead) to Gone and Skipped.
func (s *Store) release(ctx context.Context, tx pgx.Tx, c *Change, subscriber string, partition *int, stream *string) error {
	rows, err := tx.Query(ctx, s.q["Release"], subscriber, partition, stream)
	if err != nil {
		return err
	}
	var id int64
	var gone bool
	_, err = pgx.ForEachRow(rows, []any{&id, &gone}, func() error {
		if gone {
			c.Gone = append(c.Gone, id)
			c.Skipped = append(c.Skipped, id)
		} else {
			c.Retried = append(c.Retried, id)
		}
		return nil
	})
	return err
}

// resume clears the Stop of the subscriber's partition (nil: all of them).
func (s *Store) resume(ctx context.Context, tx pgx.Tx, subscriber string, partition *int) ([]Halt, error) {
	rows, err := tx.Query(ctx, s.q["Resume"], subscriber, partition)
	if err != nil {
		return nil, err
	}
	var out []Halt
	var h Halt
	var since *time.Time
	_, err = pgx.ForEachRow(rows, []any{&h.Partition, &h.Reason, &since}, func() error {
		h.Subscriber, h.Since = subscriber, time.Time{}
		if since != nil {
			h.Since = *since
		}
		out = append(out, h)
		return nil
	})
	return out, err
}
