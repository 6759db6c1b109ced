package deadletter

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
)

const (
	// DefaultLimit is the page size of List when Filter.Limit is 0.
	DefaultLimit = 100
	// MaxLimit is the largest Filter.Limit.
	MaxLimit = 1000
)

// Filter chooses the dead letters List returns. Empty fields match
// everything; the others must match exactly.
type Filter struct {
	// Subscriber is the subscriber's name.
	Subscriber string
	// Stream is the stream ID of the event.
	Stream string
	// Type is the event type.
	Type string
	// Status is one of the four statuses.
	Status Status
	// Limit is the page size, 1 to MaxLimit. Defaults to DefaultLimit (100).
	Limit int
	// Before, when not 0, is the cursor of the next older page: only dead
	// letters with IDs below it match. Set it to the ID of the last dead
	// letter of a page to get the page after it: no dead letter is listed
	// twice or passed over, however many are added or purged meanwhile.
	Before int64
	// After, when not 0, is the cursor of the next newer page: only dead
	// letters with IDs above it match, and the page is the Limit of them
	// nearest to it (still listed newest first). Set it to the ID of the
	// first dead letter of a page to get the page before it. At most one of
	// Before and After.
	After int64
	// Offset is how many matching dead letters to pass over first. Defaults
	// to 0. Prefer Before: dead letters added or purged between two pages
	// shift an offset, so that the next page repeats dead letters already
	// listed or passes over some. Not with Before or After.
	Offset int
}

// Page is one page of List.
type Page struct {
	// DeadLetters are the matching dead letters, newest first (by ID, the
	// order they were created in).
	DeadLetters []DeadLetter
	// More reports whether further dead letters match beyond this page, in
	// the direction of the paging: older ones (ask again with Before set to
	// the ID of the last dead letter), or, for a page of Filter.After, newer
	// ones (ask again with After set to the ID of the first).
	More bool
}

// List returns a page of the dead letters that match f, newest first. It
// returns a slice rather than an iterator: a page is at most MaxLimit rows,
// and an operator pages through them with Before.
func (s *Store) List(ctx context.Context, f Filter) (Page, error) {
	if f.Status != "" && !f.Status.Valid() {
		return Page{}, errors.Wrapf(ErrInvalid, "status %q: want open, retry, resolved or skipped", string(f.Status))
	}
	if f.Limit == 0 {
		f.Limit = DefaultLimit
	}
	if f.Limit < 1 || f.Limit > MaxLimit {
		return Page{}, errors.Wrapf(ErrInvalid, "limit %d: want 1 to %d", f.Limit, MaxLimit)
	}
	if f.Offset < 0 {
		return Page{}, errors.Wrapf(ErrInvalid, "offset %d: want 0 or more", f.Offset)
	}
	if f.Before < 0 {
		return Page{}, errors.Wrapf(ErrInvalid, "before %d: want a dead letter ID (1 or more), or 0 for the newest", f.Before)
	}
	if f.After < 0 {
		return Page{}, errors.Wrapf(ErrInvalid, "after %d: want a dead letter ID (1 or more), or 0", f.After)
	}
	if f.Before != 0 && f.After != 0 {
		return Page{}, errors.Wrap(ErrInvalid, "before and after: give one cursor, not both")
	}
	if f.Offset != 0 && (f.Before != 0 || f.After != 0) {
		return Page{}, errors.Wrap(ErrInvalid, "offset with a cursor (before or after): give one or the other")
	}
	// One row beyond the page tells whether there is more. QueryExecModeExec
	// (an unnamed statement) has the query planned for these arguments every
	// time: a cached generic plan could not drop the filters that are not
	// set, nor know the limit, and sorts the whole table instead of walking
	// an index.
	query, bound := s.q["List"], f.Before
	if bound == 0 {
		bound = math.MaxInt64
	}
	if f.After != 0 {
		query, bound = s.q["ListAfter"], f.After
	}
	rows, err := s.pool.Query(ctx, query, pgx.QueryExecModeExec,
		f.Subscriber, f.Stream, f.Type, string(f.Status), f.Limit+1, f.Offset, bound)
	if err != nil {
		return Page{}, errors.Wrap(err, "deadletter: list")
	}
	page := Page{DeadLetters: make([]DeadLetter, 0, min(f.Limit, 64))}
	var d DeadLetter
	var sc scan
	_, err = pgx.ForEachRow(rows, sc.targets(&d), func() error {
		sc.finish(&d)
		page.DeadLetters = append(page.DeadLetters, d)
		return nil
	})
	if err != nil {
		return Page{}, errors.Wrap(err, "deadletter: list")
	}
	if len(page.DeadLetters) > f.Limit {
		page.DeadLetters, page.More = page.DeadLetters[:f.Limit], true
	}
	if f.After != 0 {
		slices.Reverse(page.DeadLetters) // ListAfter reads oldest first
	}
	return page, nil
}

// Get returns the dead letter with the given ID, or an error matching
// ErrNotFound.
func (s *Store) Get(ctx context.Context, id int64) (DeadLetter, error) {
	if err := validID(id); err != nil {
		return DeadLetter{}, err
	}
	var d DeadLetter
	var sc scan
	err := s.pool.QueryRow(ctx, s.q["Get"], id).Scan(sc.targets(&d)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetter{}, notFound(id)
	}
	if err != nil {
		return DeadLetter{}, errors.Wrapf(err, "deadletter: get %d", id)
	}
	sc.finish(&d)
	return d, nil
}

// scan holds the nullable columns of a row while it is read.
type scan struct {
	first, last *time.Time
}

// targets lists where the columns of Get and List go.
func (sc *scan) targets(d *DeadLetter) []any {
	return []any{&d.ID, &d.Subscriber, &d.Partition, &d.EventID, &d.GlobalSequence, &d.StreamID, &d.EventType,
		&d.Reason, &d.Error, &d.ErrorDetail, &d.Attempts, &d.Status, &sc.first, &sc.last, &d.CreatedAt, &d.UpdatedAt}
}

// finish copies the scanned nullable columns into d.
func (sc *scan) finish(d *DeadLetter) {
	d.FirstFailedAt, d.LastFailedAt = time.Time{}, time.Time{}
	if sc.first != nil {
		d.FirstFailedAt = *sc.first
	}
	if sc.last != nil {
		d.LastFailedAt = *sc.last
	}
}
