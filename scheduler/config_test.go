package scheduler

import (
	"math"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
)

// A ClaimTimeout that PostgreSQL refuses (or reads as "no timeout") is
// refused by New: taken, it made every claim, so every pass, fail, and no
// timer or tick ever fired.
func TestNewRejectsAClaimTimeoutPostgreSQLCannotTake(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	s := newScheduler(t, db, nil)
	for _, d := range []time.Duration{math.MaxInt64, maxClaimTimeout + time.Millisecond, 999 * time.Microsecond, -time.Second} {
		if _, err := New(s.store, &Config{ClaimTimeout: d}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New with ClaimTimeout %v: %v, want ErrInvalidConfig", d, err)
		}
	}
	if _, err := New(s.store, &Config{Schema: "other"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New with another schema: %v, want ErrInvalidConfig", err)
	}
	// The largest one works: a timer fires.
	b := newScheduler(t, db, &Config{ClaimTimeout: maxClaimTimeout})
	if _, err := b.Schedule(t.Context(), nil, time.Now().Add(-time.Second), "max", ev("x", map[string]any{})); err != nil {
		t.Fatal(err)
	}
	if n, err := b.FireDue(t.Context()); n != 1 || err != nil {
		t.Errorf("ClaimTimeout %v: FireDue = %d, %v; want 1 timer fired", maxClaimTimeout, n, err)
	}
}

// A huge MaxRetryBackoff does not make the doubling back-off overflow into
// a negative delay (a retry at once).
func TestBackoffDoesNotOverflow(t *testing.T) {
	t.Parallel()
	s := &Scheduler{cfg: Config{RetryBackoff: 1 << 61, MaxRetryBackoff: math.MaxInt64}}
	for attempt := 1; attempt < 70; attempt++ {
		if d := s.backoff(attempt); d < 1<<61 {
			t.Fatalf("backoff(%d) = %v, want at least RetryBackoff", attempt, d)
		}
	}
	if d := s.backoff(69); d != math.MaxInt64 {
		t.Errorf("backoff(69) = %v, want MaxRetryBackoff", d)
	}
}
