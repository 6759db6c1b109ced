package projection

import (
	"context"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
)

// A rebuild whose lock was lost stops with an error that says so and
// matches ctx's end, also when the replay ended through a statement the
// server cancelled (57014) rather than through ctx itself: pgx returns
// either, depending on which arrives first.
func TestLockLostMatchesCancellation(t *testing.T) {
	lost := errors.New("the rebuild lock was lost")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(lost)
	for _, replay := range []error{
		errors.New("ERROR: canceling statement due to user request (SQLSTATE 57014)"),
		errors.Wrap(context.Canceled, "replay"),
	} {
		err := lockLost(ctx, replay)
		if !errors.Is(err, context.Canceled) || !errors.Is(err, lost) || !errors.Is(err, replay) {
			t.Errorf("lockLost(%v) = %v: want it to match context.Canceled, the lost lock and the replay's error", replay, err)
		}
		if want := "the rebuild lock was lost; the rebuild stopped: " + replay.Error(); err.Error() != want {
			t.Errorf("lockLost(%v) says %q, want %q", replay, err.Error(), want)
		}
		if strings.Count(err.Error(), "context canceled") > strings.Count(replay.Error(), "context canceled") {
			t.Errorf("lockLost(%v) repeats the cancellation: %q", replay, err)
		}
	}
}
