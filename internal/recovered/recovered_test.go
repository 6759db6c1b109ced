package recovered_test

import (
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/internal/recovered"
)

func TestCall(t *testing.T) {
	want := errors.New("plain")
	if err := recovered.Call("handler", func() error { return want }); err != want {
		t.Fatalf("an error returned: %v", err)
	}
	if err := recovered.Call("handler", func() error { return nil }); err != nil {
		t.Fatalf("nil returned: %v", err)
	}
	err := recovered.Call("Event func", func() error { panic("boom") })
	if err == nil || err.Error() != "Event func panicked: boom" {
		t.Fatalf("a panic: %v", err)
	}
	if d := strings.Join(errors.GetAllDetails(err), "\n"); !strings.Contains(d, "recovered_test.go") {
		t.Fatalf("the detail holds no stack of the panic: %q", d)
	}
}
