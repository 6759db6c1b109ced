package errmark_test

import (
	stderrors "errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/internal/errmark"
)

func TestMark(t *testing.T) {
	sentinel := errors.New("sentinel")
	other := errors.New("other")
	cause := &customErr{msg: "the cause"}
	err := errors.Wrap(errmark.Mark(errors.Wrap(cause, "context"), sentinel), "outer")
	if !stderrors.Is(err, sentinel) || !errors.Is(err, sentinel) {
		t.Fatalf("%v does not match the mark (std %v, cockroachdb %v)", err, stderrors.Is(err, sentinel), errors.Is(err, sentinel))
	}
	if stderrors.Is(err, other) || errors.Is(err, other) {
		t.Fatal("matches another sentinel")
	}
	var ce *customErr
	if !stderrors.As(err, &ce) || ce != cause {
		t.Fatal("As does not reach the cause")
	}
	if err.Error() != "outer: context: the cause" {
		t.Fatalf("message %q", err.Error())
	}
	if v := fmt.Sprintf("%+v", err); !strings.Contains(v, "the cause") || !strings.Contains(v, "errmark_test.go") || !strings.Contains(v, "marked as: sentinel") {
		t.Fatalf("%%+v lost the cause or its stack:\n%s", v)
	}
	if errmark.Mark(nil, sentinel) != nil {
		t.Fatal("Mark(nil) is not nil")
	}
	// A mark that itself matches another sentinel passes that on.
	wrappedMark := errors.Wrap(sentinel, "more specific")
	if e := errmark.Mark(errors.New("x"), wrappedMark); !stderrors.Is(e, sentinel) {
		t.Fatal("the mark's own match is lost")
	}
}

type customErr struct{ msg string }

func (c *customErr) Error() string { return c.msg }
