package eventstore_test

// Tests of how an *InvalidEventError reads: the field at fault, then what
// is wrong with it, whichever check (Go or personal data) refused the input.

import (
	"testing"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

func TestInvalidEventMessages(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	personal := personalStore(t, db, newKEK(t), nil)
	plain, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	noSubject := ada("")
	cases := []struct {
		name  string
		store *eventstore.Store
		event eventstore.EventData
		want  string
	}{
		{"PersonalDataWithoutSubject", personal, eventstore.NewEvent(noSubject),
			`invalid event: event 1: data: the subject ID customer_id of its personal data is missing or empty (an unset field: its type's zero value, such as "", 0 or the nil UUID)`},
		{"DataNil", plain, eventstore.EventData{Type: "t"},
			`invalid event: event 1: data: is nil; it must be a JSON object or array`},
		{"TypeReserved", plain, eventstore.EventData{Type: "$stream.x", Data: map[string]int{}},
			`invalid event: event 1: type: starts with "$stream.", which is reserved for annals (see DeleteStream, annals stream delete)`},
		{"MetadataReservedKey", plain, eventstore.EventData{Type: "t", Data: map[string]int{}, Metadata: eventstore.Metadata{Extra: map[string]any{"correlation_id": 5}}},
			`invalid event: event 1: metadata: key "correlation_id" is reserved for the correlation ID and must be a string (in Go: Metadata.CorrelationID or Metadata.CausationID, not Extra)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.store.Append(ctx, "msg-1", eventstore.Any, c.event)
			if err == nil || err.Error() != c.want {
				t.Fatalf("Append = %v, want %q", err, c.want)
			}
		})
	}
	if _, err := plain.Append(ctx, "", eventstore.Any, eventstore.EventData{Type: "t", Data: map[string]int{}}); err == nil ||
		err.Error() != `invalid event: stream_id: is empty` {
		t.Fatalf("Append to an empty stream ID = %v", err)
	}
}
