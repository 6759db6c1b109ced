package eventstore_test

// Tests of Register's refusals: types whose JSON can never be an event's
// data (a JSON object or array) are refused at registration, not on every
// append; every type that may encode to one is accepted.

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/eventstore"
)

type (
	regStruct      struct{ A int }
	regMap         map[string]int
	regSlice       []int
	regBytes       []byte
	regString      string
	regInt         int
	regTextOnly    struct{ A int }            // MarshalText (value receiver): a JSON string
	regTextPtr     struct{ A int }            // MarshalText on *T only: T values are objects
	regJSONPtr     int                        // MarshalJSON on *T: it decides
	regJSONString  string                     // MarshalJSON on T: it decides
	regTextElem    byte                       // a byte with MarshalText: []regTextElem is an array
	regTextElemArr []regTextElem              //
	regJSONText    struct{ A int }            // both: MarshalJSON wins
	regArray       [4]byte                    // an array of numbers
	regIface       interface{ Kind() string } // values of other types
)

func (regTextOnly) MarshalText() ([]byte, error)   { return []byte("x"), nil }
func (*regTextPtr) MarshalText() ([]byte, error)   { return []byte("x"), nil }
func (*regJSONPtr) MarshalJSON() ([]byte, error)   { return []byte(`{}`), nil }
func (regJSONString) MarshalJSON() ([]byte, error) { return []byte(`{}`), nil }
func (regTextElem) MarshalText() ([]byte, error)   { return []byte("x"), nil }
func (regJSONText) MarshalJSON() ([]byte, error)   { return []byte(`{}`), nil }
func (regJSONText) MarshalText() ([]byte, error)   { return []byte("x"), nil }

func TestRegisterDataShape(t *testing.T) {
	t.Parallel()
	reg := eventstore.NewRegistry()
	refused := map[string]error{
		"int":         eventstore.Register[int](reg, "int"),
		"string":      eventstore.Register[string](reg, "string"),
		"bool":        eventstore.Register[bool](reg, "bool"),
		"float64":     eventstore.Register[float64](reg, "float64"),
		"[]byte":      eventstore.Register[[]byte](reg, "bytes"),
		"named bytes": eventstore.Register[regBytes](reg, "regBytes"),
		"named int":   eventstore.Register[regInt](reg, "regInt"),
		"named str":   eventstore.Register[regString](reg, "regString"),
		"MarshalText": eventstore.Register[regTextOnly](reg, "regTextOnly"),
		"chan":        eventstore.Register[chan int](reg, "chan"),
		"func":        eventstore.Register[func()](reg, "func"),
	}
	for name, err := range refused {
		if !errors.Is(err, eventstore.ErrInvalidEvent) || !strings.Contains(err.Error(), "must be a JSON object or array") {
			t.Errorf("Register of %s = %v, want ErrInvalidEvent saying data must be a JSON object or array", name, err)
		}
	}
	if got := reg.Types(); len(got) != 0 {
		t.Errorf("refused types were registered: %v", got)
	}
	if err := eventstore.Register[int](reg, "int"); err == nil || !strings.Contains(err.Error(), `cannot register int as event type "int": its JSON is a number`) {
		t.Errorf("Register[int] = %v", err)
	}

	accepted := map[string]error{
		"struct":            eventstore.Register[regStruct](reg, "regStruct"),
		"map":               eventstore.Register[regMap](reg, "regMap"),
		"map[string]any":    eventstore.Register[map[string]any](reg, "mapAny"),
		"slice":             eventstore.Register[regSlice](reg, "regSlice"),
		"json.RawMessage":   eventstore.Register[json.RawMessage](reg, "raw"),
		"MarshalText on *T": eventstore.Register[regTextPtr](reg, "regTextPtr"),
		"MarshalJSON on *T": eventstore.Register[regJSONPtr](reg, "regJSONPtr"),
		"MarshalJSON on T":  eventstore.Register[regJSONString](reg, "regJSONString"),
		"[]TextMarshaler":   eventstore.Register[regTextElemArr](reg, "regTextElemArr"),
		"MarshalJSON+Text":  eventstore.Register[regJSONText](reg, "regJSONText"),
		"array":             eventstore.Register[regArray](reg, "regArray"),
		"interface":         eventstore.Register[regIface](reg, "regIface"),
		// A MarshalJSON method decides, even one that returns a string
		// (time.Time): reflection cannot tell; the append refuses it.
		"time.Time": eventstore.Register[time.Time](reg, "time"),
	}
	for name, err := range accepted {
		if err != nil {
			t.Errorf("Register of %s: %v", name, err)
		}
	}
}
