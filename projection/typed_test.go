package projection_test

// Tests of mistakes made while assembling typed handlers (projection.On,
// projection.Observe): they are refused when the handler is registered,
// not found later by dead-lettering every event.

import (
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

type typedNilEvent struct {
	N int `json:"n"`
}

func TestTypedNilHandler(t *testing.T) {
	t.Parallel()
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[typedNilEvent](reg, "typed.nil")
	r, err := projection.NewRunner(annalstest.NewDB(t, nil).Pool, nil)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("On", func(t *testing.T) {
		p := projection.New("typed.nil.p", reg)
		projection.On[typedNilEvent](p, nil)
		if got := p.EventTypes(); len(got) != 0 {
			t.Errorf("EventTypes after On(nil) = %v, want none", got)
		}
		err := r.Register(p, nil)
		if err == nil || !strings.Contains(err.Error(), `projection "typed.nil.p": nil handler function for "typed.nil"`) {
			t.Fatalf("Register after On(nil) = %v", err)
		}
	})

	t.Run("Observe", func(t *testing.T) {
		o := projection.NewObserver("typed.nil.o", reg)
		projection.Observe[typedNilEvent](o, nil)
		if got := o.EventTypes(); len(got) != 0 {
			t.Errorf("EventTypes after Observe(nil) = %v, want none", got)
		}
		err := r.Register(o, nil)
		if err == nil || !strings.Contains(err.Error(), `observer "typed.nil.o": nil handler function for "typed.nil"`) {
			t.Fatalf("Register after Observe(nil) = %v", err)
		}
	})
}
