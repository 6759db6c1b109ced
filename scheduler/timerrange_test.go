package scheduler

import (
	"math"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
)

// A due time the database cannot hold is refused. pgx's timestamptz
// encoding wraps around silently: a timer due in the year 292277026596 was
// stored as due in 1969, and fired at once.
func TestScheduleRefusesADueTimeOutsideTheYears1To9999(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})
	ctx := t.Context()
	for _, at := range []time.Time{
		time.Unix(math.MaxInt64/1000, 0), // was stored as 1969-12-31, fired at once
		time.Unix(1<<50, 0),              // was stored as the year 22520
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC), // outside PostgreSQL's range
		time.Date(0, 12, 31, 23, 59, 59, 0, time.UTC),
		time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(10000, 1, 1, 1, 0, 0, 0, time.FixedZone("+02", 2*3600)), // 9999-12-31 23:00 UTC: fine
	} {
		_, err := s.Schedule(ctx, nil, at, "far", ev("far.x", map[string]any{}))
		if at.UTC().Year() == 9999 {
			if err != nil {
				t.Errorf("Schedule at %v (UTC %v): %v", at, at.UTC(), err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidTimer) {
			t.Errorf("Schedule at %v: %v, want ErrInvalidTimer", at, err)
		}
	}
	// The bounds are stored as they are: the last second of 9999 does not
	// fire now, the first day of the year 1 does.
	last := time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
	id, err := s.Schedule(ctx, nil, last, "far", ev("far.x", map[string]any{}))
	if err != nil {
		t.Fatal(err)
	}
	var due time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT due_at FROM annals.timers WHERE id = $1`, id).Scan(&due); err != nil || !due.Equal(last) {
		t.Errorf("due_at stored as %v (%v), want %v", due, err, last)
	}
	if _, err := s.Schedule(ctx, nil, time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC), "past", ev("past.x", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	if n := fireDue(t, s); n != 1 || eventsIn(t, db, "far") != 0 || eventsIn(t, db, "past") != 1 {
		t.Errorf("FireDue fired %d: %d events in far, %d in past; want only the timer in the past", n, eventsIn(t, db, "far"), eventsIn(t, db, "past"))
	}
	if got := timerRows(t, db); got != 2 {
		t.Errorf("%d timers stored, want the two in 9999", got)
	}
}
