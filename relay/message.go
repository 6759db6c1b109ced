package relay

import (
	"encoding/json"
	"net/textproto"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/eventstore"
)

// Headers of a relayed message. The body is the event's data as stored.
const (
	// HeaderRelay names the relay that published the message (Config.Name;
	// like the stream ID, also sent in HeaderRelayJSON when it starts or
	// ends with white space).
	HeaderRelay = "Annals-Relay"
	// HeaderRelayJSON is the relay's name as a JSON string, present only
	// when HeaderRelay would lose white space at either end.
	HeaderRelayJSON = "Annals-Relay-Json"
	// HeaderOrigin is where the relayed log is, as "<system
	// identifier>/<database>/<schema>": the PostgreSQL cluster's system
	// identifier (pg_control_system; "0" when the relay's role may not run
	// it), the database and the annals schema, the names escaped as by
	// EscapeToken. A relay refuses a stream whose newest message has
	// another origin (ErrStreamMismatch; see Config.AdoptStream); a cluster
	// part "0" matches any cluster of the same database and schema.
	// Messages of relays older than this header have none.
	HeaderOrigin = "Annals-Origin"
	// HeaderPosition is the event's global sequence (decimal).
	HeaderPosition = "Annals-Position"
	// HeaderEventID is the event ID (also the Nats-Msg-Id).
	HeaderEventID = "Annals-Event-Id"
	// HeaderStreamID is the stream the event belongs to (unescaped). NATS
	// drops white space at either end of a header value: a stream ID that
	// starts or ends with a space or tab is also sent, exactly, in
	// HeaderStreamIDJSON.
	HeaderStreamID = "Annals-Stream-Id"
	// HeaderStreamIDJSON is the stream ID as a JSON string, present only
	// when HeaderStreamID would lose white space at either end. Decode
	// prefers it.
	HeaderStreamIDJSON = "Annals-Stream-Id-Json"
	// HeaderStreamVersion is the event's version in its stream (decimal).
	HeaderStreamVersion = "Annals-Stream-Version"
	// HeaderType is the event type (unescaped); like the stream ID, also
	// sent in HeaderTypeJSON when it starts or ends with white space.
	HeaderType = "Annals-Event-Type"
	// HeaderTypeJSON is the event type as a JSON string, present only when
	// HeaderType would lose white space at either end.
	HeaderTypeJSON = "Annals-Event-Type-Json"
	// HeaderRecordedAt is when the event was appended (RFC 3339, nanoseconds).
	HeaderRecordedAt = "Annals-Recorded-At"
	// HeaderCorrelationID and HeaderCausationID carry the metadata's IDs.
	HeaderCorrelationID = "Annals-Correlation-Id"
	HeaderCausationID   = "Annals-Causation-Id"
	// HeaderMetadata is the event's whole metadata as JSON (absent when empty).
	HeaderMetadata = "Annals-Metadata"
	// HeaderTraceparent and HeaderTracestate are the W3C trace context of the
	// append that produced the event.
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Message returns the JetStream message the relay named relayName publishes
// for e on subject.
func Message(relayName, subject string, e eventstore.Event) (*nats.Msg, error) {
	m := nats.NewMsg(subject)
	m.Data = e.Data
	h := m.Header
	h.Set(jetstream.MsgIDHeader, e.ID.String())
	setExact(h, HeaderRelay, HeaderRelayJSON, relayName)
	h.Set(HeaderPosition, strconv.FormatInt(e.GlobalSequence, 10))
	h.Set(HeaderEventID, e.ID.String())
	setExact(h, HeaderStreamID, HeaderStreamIDJSON, e.StreamID)
	h.Set(HeaderStreamVersion, strconv.FormatInt(e.StreamVersion, 10))
	setExact(h, HeaderType, HeaderTypeJSON, e.Type)
	h.Set(HeaderRecordedAt, e.RecordedAt.UTC().Format(time.RFC3339Nano))
	if e.Metadata.CorrelationID != "" {
		h.Set(HeaderCorrelationID, e.Metadata.CorrelationID)
	}
	if e.Metadata.CausationID != "" {
		h.Set(HeaderCausationID, e.Metadata.CausationID)
	}
	if !e.Metadata.IsZero() {
		md, err := json.Marshal(e.Metadata)
		if err != nil {
			return nil, errors.Wrapf(err, "relay: encode the metadata of %s", e.ID)
		}
		h.Set(HeaderMetadata, string(md))
		for _, k := range []string{HeaderTraceparent, HeaderTracestate} {
			if v, ok := e.Metadata.Extra[k].(string); ok && v != "" {
				h.Set(k, v)
			}
		}
	}
	return m, nil
}

// setExact sets key to v and, when NATS would not carry v as it is (it
// trims spaces and tabs at either end of a header value, and of the header
// block's lines), jsonKey to v as a JSON string, which begins and ends
// with a quote.
func setExact(h nats.Header, key, jsonKey, v string) {
	h.Set(key, v)
	if textproto.TrimString(v) != v {
		b, _ := json.Marshal(v) // a string always encodes
		h.Set(jsonKey, string(b))
	}
}

// getExact reads what setExact set.
func getExact(h nats.Header, key, jsonKey string) (string, error) {
	j := h.Get(jsonKey)
	if j == "" {
		return h.Get(key), nil
	}
	var v string
	if err := json.Unmarshal([]byte(j), &v); err != nil {
		return "", errors.Wrapf(ErrNotRelayed, "%s %q", jsonKey, j)
	}
	return v, nil
}

// ErrNotRelayed is matched by Decode for a message without the relay's
// headers.
var ErrNotRelayed = errors.New("relay: not a relayed annals event")

// Decode returns the event a relayed message carries (header and data of a
// nats.Msg or a jetstream.Msg).
func Decode(h nats.Header, data []byte) (eventstore.Event, error) {
	var e eventstore.Event
	if h.Get(HeaderPosition) == "" || h.Get(HeaderEventID) == "" {
		return e, ErrNotRelayed
	}
	var err error
	if e.GlobalSequence, err = strconv.ParseInt(h.Get(HeaderPosition), 10, 64); err != nil {
		return e, errors.Wrapf(ErrNotRelayed, "position %q", h.Get(HeaderPosition))
	}
	if e.ID, err = uuid.Parse(h.Get(HeaderEventID)); err != nil {
		return e, errors.Wrapf(ErrNotRelayed, "event ID %q", h.Get(HeaderEventID))
	}
	if e.StreamVersion, err = strconv.ParseInt(h.Get(HeaderStreamVersion), 10, 64); err != nil {
		return e, errors.Wrapf(ErrNotRelayed, "stream version %q", h.Get(HeaderStreamVersion))
	}
	if e.RecordedAt, err = time.Parse(time.RFC3339Nano, h.Get(HeaderRecordedAt)); err != nil {
		return e, errors.Wrapf(ErrNotRelayed, "recorded at %q", h.Get(HeaderRecordedAt))
	}
	if e.StreamID, err = getExact(h, HeaderStreamID, HeaderStreamIDJSON); err != nil {
		return e, err
	}
	if e.Type, err = getExact(h, HeaderType, HeaderTypeJSON); err != nil {
		return e, err
	}
	e.Data = json.RawMessage(data)
	if md := h.Get(HeaderMetadata); md != "" {
		if err := json.Unmarshal([]byte(md), &e.Metadata); err != nil {
			return e, errors.Wrap(err, "relay: decode metadata")
		}
	}
	return e, nil
}
