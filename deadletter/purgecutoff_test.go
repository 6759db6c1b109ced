package deadletter_test

import (
	"math"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/deadletter"
)

// A purge cutoff the database cannot hold is refused. pgx's timestamptz
// encoding wraps around silently: this cutoff, billions of years in the
// past ("purge nothing"), reached the database as 2100-01-01 and purged
// every resolved dead letter.
func TestDeadLetterPurgeRefusesACutoffOutsideTheYears1To9999(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.add(t, deadletter.DeadLetter{GlobalSequence: 1, Status: deadletter.StatusResolved, UpdatedAt: time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)})
	wrapsTo2100 := time.Unix(4102444800-1<<58, 0) // ×10⁶ µs ≡ 2100-01-01 mod 2⁶⁴
	for _, cutoff := range []time.Time{
		wrapsTo2100,
		time.Unix(math.MaxInt64/1000, 0),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(0, 6, 1, 0, 0, 0, 0, time.UTC),
	} {
		n, err := b.store.Purge(t.Context(), cutoff, true)
		if !errors.Is(err, deadletter.ErrInvalid) {
			t.Errorf("Purge(%v): %d, %v; want ErrInvalid", cutoff, n, err)
		}
	}
	if got := len(b.statuses(t)); got != 1 {
		t.Errorf("%d dead letters left, want 1", got)
	}
}
