package projection

import (
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/checkpoint"
)

// combine puts the error that makes the engine release its lock first,
// wherever it was, since errors.Is does not look at secondary errors.
func TestCombineKeepsTheFenceVisible(t *testing.T) {
	handler := errors.New("handler failed")
	timeout := errors.New("checkpoint write timed out")
	fenced := errors.Wrap(checkpoint.ErrFenced, "commit")
	lost := errors.Wrap(advisorylock.ErrLost, "lock")
	for _, c := range []struct {
		a, b error
		want error
	}{
		{fenced, handler, checkpoint.ErrFenced},
		{handler, fenced, checkpoint.ErrFenced},
		{timeout, lost, advisorylock.ErrLost},
		{lost, nil, advisorylock.ErrLost},
	} {
		if err := combine(c.a, c.b); !errors.Is(err, c.want) {
			t.Errorf("combine(%v, %v) = %v: errors.Is(%v) is false", c.a, c.b, err, c.want)
		}
	}
	if err := combine(timeout, handler); !errors.Is(err, timeout) || errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("combine of two ordinary errors = %v, want the first", err)
	}
	if combine(nil, nil) != nil {
		t.Error("combine(nil, nil) != nil")
	}
}
