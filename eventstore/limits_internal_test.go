package eventstore

import (
	"encoding/json"
	"testing"
)

// BenchmarkInputChecks measures the Go-side checks of one event on the happy
// path: a stream ID, a type, a 100-byte payload and its metadata.
func BenchmarkInputChecks(b *testing.B) {
	data := []byte(`{"order_id":"order-0193a1b2-7c3d-7e4f-8a5b","total":100,"lines":[{"sku":"A-1","qty":2}],"note":"x"}`)
	md := Metadata{CorrelationID: "req-7", Extra: map[string]any{"tenant": "acme"}}
	meta, _ := json.Marshal(md)
	b.ReportAllocs()
	for b.Loop() {
		if checkName(0, "stream_id", "order-0193a1b2-7c3d-7e4f-8a5b-6c7d8e9f0a1b", MaxStreamIDBytes) != nil ||
			checkExpected(Exact(7), 1) != nil ||
			checkName(1, "type", "order.placed", MaxEventTypeBytes) != nil ||
			checkJSONText(data, true) != "" ||
			checkMetadata(1, md) != nil ||
			checkJSONText(meta, true) != "" {
			b.Fatal("a check failed")
		}
	}
}

func TestCheckJSONText(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{ // true: refused
		`{"a":"\u0000"}`:            true,
		`{"a":"\\u0000"}`:           false, // an escaped backslash, then text
		`{"a":"\\\u0000"}`:          true,
		`{"a":"\ud83d\ude00"}`:      false,
		`{"a":"\ud83d"}`:            true,
		`{"a":"\ude00"}`:            true,
		`{"a":"\ud83d\u0041"}`:      true,
		`{"a":"\uD83D\uDE00 \n\""}`: false,
	} {
		if got := checkJSONText([]byte(in), false) != ""; got != want {
			t.Errorf("checkJSONText(%s) refused = %v, want %v", in, got, want)
		}
	}
	if checkJSONText([]byte(`{"a":"\ufffd"}`), false) != "" || checkJSONText([]byte(`{"a":"\ufffd"}`), true) == "" {
		t.Error(`\ufffd: allowed in raw JSON, refused in encoding/json's output`)
	}
}
