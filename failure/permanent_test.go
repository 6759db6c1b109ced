package failure_test

import (
	stderrors "errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/failure"
)

func TestPermanent(t *testing.T) {
	t.Parallel()
	base := errors.New("bad amount")
	p := failure.Permanent(base)
	if !failure.IsPermanent(p) || !errors.Is(p, base) || p.Error() != "bad amount" {
		t.Fatalf("Permanent(%v) = %v", base, p)
	}
	wrapped := fmt.Errorf("handler: %w", errors.Wrap(p, "decode"))
	if !failure.IsPermanent(wrapped) {
		t.Fatal("the mark does not survive wrapping")
	}
	// The standard library's errors.Is sees the mark too.
	if !stderrors.Is(wrapped, failure.ErrPermanent) || !stderrors.Is(wrapped, base) {
		t.Fatal("the standard library's errors.Is misses the mark or the cause")
	}
	// The cause's stack survives in %+v.
	if s := fmt.Sprintf("%+v", p); !strings.Contains(s, "permanent_test.go") {
		t.Fatalf("%%+v lost the stack: %s", s)
	}
	if failure.IsPermanent(base) || failure.Permanent(nil) != nil {
		t.Fatal("unmarked error reported permanent, or Permanent(nil) != nil")
	}
}

func ExamplePermanent() {
	err := failure.Permanent(errors.New("order total is negative"))
	fmt.Println(failure.IsPermanent(err), err)
	// Output: true order total is negative
}
