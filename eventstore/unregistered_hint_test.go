package eventstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
)

type unregisteredLoan struct{ Member string }

// An append of a Go type the registry does not know (the usual slip: an
// aggregate's new event, recorded but never registered) says how to
// register it; it said that EventData.Type was empty, which an aggregate's
// author never set or saw.
func TestUnregisteredTypeSaysHowToRegister(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := b.store.Append(context.Background(), "loan-1", eventstore.Any, eventstore.NewEvent(unregisteredLoan{Member: "ann"}))
	if !errors.Is(err, eventstore.ErrUnknownEventType) || !errors.Is(err, eventstore.ErrInvalidEvent) {
		t.Fatalf("err = %v, want ErrUnknownEventType and ErrInvalidEvent", err)
	}
	for _, want := range []string{"eventstore_test.unregisteredLoan is not registered", "eventstore.Register[eventstore_test.unregisteredLoan](registry, "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %q, want it to contain %q", err, want)
		}
	}
}
