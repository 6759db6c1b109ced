package eventstore_test

import (
	"encoding/json"
	stderrors "errors"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
)

type decodeAmount struct {
	Amount int `json:"amount"`
}

// Data that does not decode into its registered type matches ErrDecode,
// with both errors.Is, through Decode and Registry.Decode, and keeps
// encoding/json's error; a failed upcast and an unregistered type do not
// match it (a caller such as a typed projection retries those).
func TestDecodeErrorIsMarked(t *testing.T) {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[decodeAmount](reg, "acct.amount")
	reg.MustRegisterUpcaster("acct.amount", 1, func(d json.RawMessage) (json.RawMessage, error) {
		if string(d) == `{"broken":true}` {
			return nil, errors.New("the upcaster is broken")
		}
		return d, nil
	})
	event := func(data string) eventstore.Event {
		return eventstore.Event{GlobalSequence: 7, Type: "acct.amount", StreamID: "s", StreamVersion: 1, Data: json.RawMessage(data)}
	}
	decodeBoth := func(e eventstore.Event) (typed, untyped error) {
		_, typed = eventstore.Decode[decodeAmount](reg, e)
		_, untyped = reg.Decode(e)
		return typed, untyped
	}

	typed, untyped := decodeBoth(event(`{"amount": "ten"}`))
	for _, err := range []error{typed, untyped} {
		var jerr *json.UnmarshalTypeError
		if !errors.Is(err, eventstore.ErrDecode) || !stderrors.Is(err, eventstore.ErrDecode) || !errors.As(err, &jerr) {
			t.Errorf("undecodable data: %v, want ErrDecode wrapping a *json.UnmarshalTypeError", err)
		}
	}
	typed, untyped = decodeBoth(event(`{"amount": 10}`))
	if typed != nil || untyped != nil {
		t.Errorf("decodable data: %v, %v", typed, untyped)
	}
	typed, untyped = decodeBoth(event(`{"broken":true}`))
	for _, err := range []error{typed, untyped} {
		if !errors.Is(err, eventstore.ErrUpcast) || errors.Is(err, eventstore.ErrDecode) {
			t.Errorf("failed upcast: %v, want ErrUpcast and not ErrDecode", err)
		}
	}
	e := event(`{"amount": 10}`)
	e.Type = "acct.other"
	typed, untyped = decodeBoth(e)
	for _, err := range []error{typed, untyped} {
		if !errors.Is(err, eventstore.ErrUnknownEventType) || errors.Is(err, eventstore.ErrDecode) {
			t.Errorf("unregistered type: %v, want ErrUnknownEventType and not ErrDecode", err)
		}
	}
}
