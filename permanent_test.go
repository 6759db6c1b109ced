package annals_test

import (
	"fmt"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/failure"
)

// The root package's Permanent is failure's: a mark made with either is
// seen by both.
func TestPermanentForwards(t *testing.T) {
	t.Parallel()
	if !failure.IsPermanent(annals.Permanent(errors.New("x"))) || !annals.IsPermanent(failure.Permanent(errors.New("y"))) {
		t.Fatal("annals and failure disagree on the mark")
	}
	if !errors.Is(failure.Permanent(errors.New("z")), annals.ErrPermanent) || annals.Permanent(nil) != nil {
		t.Fatal("ErrPermanent is not failure.ErrPermanent, or Permanent(nil) != nil")
	}
}

func ExamplePermanent() {
	err := annals.Permanent(errors.New("order total is negative"))
	fmt.Println(annals.IsPermanent(err), err)
	// Output: true order total is negative
}
