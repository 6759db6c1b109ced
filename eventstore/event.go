package eventstore

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/annals-dev/annals/internal/telemetry"
)

// ExpectedVersion is the version a stream must have for an append to
// succeed: Any, NoStream, StreamExists, or an exact version from Exact.
type ExpectedVersion int64

const (
	// Any appends whatever the stream's version (SQL: NULL).
	Any ExpectedVersion = -2
	// StreamExists requires the stream to have at least one event (SQL: -1).
	StreamExists ExpectedVersion = -1
	// NoStream requires the stream to have no events (SQL: 0).
	NoStream ExpectedVersion = 0
)

// Exact requires the stream's current version to be v. Stream versions start
// at 1; Exact(0) is NoStream.
func Exact(v int64) ExpectedVersion { return ExpectedVersion(v) }

func (v ExpectedVersion) String() string {
	switch {
	case v == Any:
		return "any"
	case v == StreamExists:
		return "stream exists"
	case v == NoStream:
		return "no stream"
	case v > 0:
		return strconv.FormatInt(int64(v), 10)
	}
	return "invalid(" + strconv.FormatInt(int64(v), 10) + ")"
}

// sqlArg is the value passed to append_events' expected_version.
func (v ExpectedVersion) sqlArg() (any, error) {
	switch {
	case v == Any:
		return nil, nil
	case v >= StreamExists:
		return int64(v), nil
	}
	return nil, checkExpected(v, 0)
}

// EventData is an event to append.
type EventData struct {
	// ID identifies the event; appending the same ID again with the same
	// stream, type and data is a no-op. Defaults to a new UUIDv7.
	ID uuid.UUID
	// Type names the event, e.g. "order.placed". Defaults to the name the
	// Registry holds for Data's Go type.
	Type string
	// Data is the payload: a json.RawMessage or []byte holding a JSON object
	// or array is stored as is; any other value is encoded with encoding/json
	// and must encode to an object or array.
	Data any
	// Metadata travels with the event (correlation and causation IDs, and
	// anything else the application puts in Extra).
	Metadata Metadata
}

// NewEvent returns EventData for a payload whose type name is found in the
// Registry, with a fresh ID assigned at append.
func NewEvent(data any) EventData { return EventData{Data: data} }

// Event is a stored event as read back.
type Event struct {
	// GlobalSequence is the event's position in the log: commit order.
	GlobalSequence int64
	// ID is the event's unique ID.
	ID uuid.UUID
	// StreamID is the stream the event belongs to.
	StreamID string
	// StreamVersion is the event's version within its stream, from 1.
	StreamVersion int64
	// Type is the event type name.
	Type string
	// Data is the payload (JSON): as stored, except where it was upcast to
	// its type's current schema version (Registry.Upcast; a Store's reads
	// and the handlers' decoding do it), which Metadata's SchemaVersionKey
	// then names.
	Data json.RawMessage
	// Metadata is the event's metadata.
	Metadata Metadata
	// RecordedAt is when the event was appended (database clock).
	RecordedAt time.Time
}

// Metadata is the JSON object stored beside an event's data.
type Metadata struct {
	// CorrelationID ties together every event caused by one original request
	// (JSON key "correlation_id").
	CorrelationID string
	// CausationID is the ID of the event or command that caused this one
	// (JSON key "causation_id").
	CausationID string
	// Extra holds every other key, decoded as encoding/json does into any.
	Extra map[string]any
}

// SpanContext returns the trace context of the span that appended the
// event (W3C "traceparent" in Extra), or an invalid SpanContext.
func (m Metadata) SpanContext() trace.SpanContext { return telemetry.Extract(m.Extra) }

// IsZero reports whether m holds nothing.
func (m Metadata) IsZero() bool {
	return m.CorrelationID == "" && m.CausationID == "" && len(m.Extra) == 0
}

// MarshalJSON writes m as one flat JSON object.
func (m Metadata) MarshalJSON() ([]byte, error) {
	obj := make(map[string]any, len(m.Extra)+2)
	for k, v := range m.Extra {
		obj[k] = v
	}
	if m.CorrelationID != "" {
		obj["correlation_id"] = m.CorrelationID
	}
	if m.CausationID != "" {
		obj["causation_id"] = m.CausationID
	}
	return json.Marshal(obj)
}

// UnmarshalJSON reads a flat JSON object (or null) into m.
func (m *Metadata) UnmarshalJSON(b []byte) error {
	*m = Metadata{}
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return nil
	}
	var obj map[string]any
	if err := json.Unmarshal(b, &obj); err != nil {
		return errors.Wrap(err, "decode event metadata")
	}
	if s, ok := obj["correlation_id"].(string); ok {
		m.CorrelationID = s
		delete(obj, "correlation_id")
	}
	if s, ok := obj["causation_id"].(string); ok {
		m.CausationID = s
		delete(obj, "causation_id")
	}
	if len(obj) > 0 {
		m.Extra = obj
	}
	return nil
}
