package eventstore

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"
)

// EncodedAppend is an append validated and rendered ahead of time: event
// IDs are assigned, types resolved through the Registry and payloads encoded.
// The scheduler stores one in a timer row and appends it when the timer is
// due; appending it twice is a no-op the second time (idempotent by event ID).
// Appending one checks it again (AppendEncodedTx, Batch.AppendEncoded): its
// form, the stream ID, the expected version, each event's data plus
// metadata against Config.MaxEventBytes, measured on Events as it is then,
// and text that PostgreSQL's jsonb cannot hold (a \u0000, an unpaired
// surrogate escape: ErrInvalidEvent, as Encode refuses it); the SQL
// function checks the rest.
type EncodedAppend struct {
	// StreamID is the stream the events go to.
	StreamID string `json:"stream_id"`
	// Expected is the expected version the append checks.
	Expected ExpectedVersion `json:"expected"`
	// Events is the JSON array that annals.append_events_json takes (the
	// form of append_events'), stored as written when appended.
	Events json.RawMessage `json:"events"`
	// Count is the number of events in Events.
	Count int `json:"count"`
}

// Encode validates and renders an append without running it; the checks
// are those of Append (stream ID and type limits, no events, unknown types,
// bad JSON, oversized events, reserved metadata keys), and so are the errors.
func (s *Store) Encode(ctx context.Context, streamID string, expected ExpectedVersion, events ...EventData) (EncodedAppend, error) {
	a, err := s.encode(ctx, streamID, expected, events)
	if err != nil {
		return EncodedAppend{}, err
	}
	return EncodedAppend{StreamID: a.stream, Expected: expected, Events: a.json(), Count: a.count}, nil
}

// AppendEncodedTx appends an EncodedAppend inside tx, with the caveats of
// AppendTx (the ordering lock is held until tx ends). To append several and
// commit in one round trip, stage them with Batch.AppendEncoded in Transact.
func (s *Store) AppendEncodedTx(ctx context.Context, tx pgx.Tx, a EncodedAppend) (res AppendResult, err error) {
	ctx, done := s.trace(ctx, "annals.append", a.StreamID, a.Expected, a.Count)
	defer func() { done(res, err) }()
	args, err := a.args(s.maxBytes)
	if err != nil {
		return AppendResult{}, err
	}
	return s.appendTx(ctx, tx, args)
}

// AppendEncoded stages an EncodedAppend inside Transact, like Append: it
// runs after the transaction body returns, in the one round trip that also
// commits. A malformed EncodedAppend, or one with an event over
// Config.MaxEventBytes (ErrInvalidEvent), is reported here, at once, and
// stages nothing.
func (b *Batch) AppendEncoded(a EncodedAppend) error {
	args, err := a.args(b.s.maxBytes)
	if err != nil {
		return err
	}
	b.appends = append(b.appends, args)
	return nil
}

// args checks a and returns its append_events_json arguments. Each event's data
// plus metadata is measured again against maxBytes, as Encode measured it:
// an EncodedAppend may have been built by hand, or kept where its bytes
// changed (a timer row stored as jsonb before migration 0033 holds jsonb's
// rendering, in which 1e131000 is 131,001 digits), and what is sent now is
// what the limit is about.
func (a EncodedAppend) args(maxBytes int) (appendArgs, error) {
	if err := checkName(0, "stream_id", a.StreamID, MaxStreamIDBytes); err != nil {
		return appendArgs{}, err
	}
	if err := checkExpected(a.Expected, a.Count); err != nil {
		return appendArgs{}, err
	}
	exp, err := a.Expected.sqlArg()
	if err != nil {
		return appendArgs{}, err
	}
	var events []struct {
		Data     json.RawMessage `json:"data"`
		Metadata json.RawMessage `json:"metadata"`
	}
	if a.Count <= 0 || json.Unmarshal(a.Events, &events) != nil || len(events) != a.Count {
		return appendArgs{}, invalidf("encoded append to stream %q is malformed", a.StreamID)
	}
	// What jsonb cannot hold (a \u0000, an unpaired surrogate escape)
	// fails append_events_json and append_events with a bare 22P05 or
	// 22P02: refused here, as Encode refuses it, by the event and field
	// that hold it. One scan of the whole array when it has none.
	if why := checkJSONText(a.Events, false); why != "" {
		return appendArgs{}, badText(a.StreamID, a.Events, why)
	}
	for i, e := range events {
		meta := e.Metadata
		if string(meta) == "null" {
			meta = nil // stored as no metadata
		}
		if n := len(e.Data) + len(meta); n > maxBytes {
			// Measured compact, as Encode measured it: a timer stored as
			// jsonb before migration 0033 holds jsonb's rendering, which
			// puts a space after every comma and colon, so an event that
			// was under the limit may read as over it by that much.
			if n = compactLen(e.Data) + compactLen(meta); n > maxBytes {
				return appendArgs{}, tooLong(i+1, "data+metadata", n, maxBytes)
			}
		}
	}
	// Its IDs were chosen when it was encoded: it may be stored already.
	return appendArgs{stream: a.StreamID, expected: exp, exp: a.Expected, payload: a.Events, count: a.Count, callerIDs: true}, nil
}

// compactLen is the length of the JSON b without insignificant white space.
func compactLen(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return len(b)
	}
	return buf.Len()
}

// badText returns the error of an append whose JSON array of events
// (append_events_json's argument) holds text that jsonb cannot hold
// (checkJSONText's reason why): an *InvalidEventError naming the event and
// the field (type, data or metadata) that holds it, when one does.
func badText(stream string, payload []byte, why string) error {
	var events []struct {
		Type     json.RawMessage `json:"type"`
		Data     json.RawMessage `json:"data"`
		Metadata json.RawMessage `json:"metadata"`
	}
	if json.Unmarshal(payload, &events) == nil {
		for i, e := range events {
			for _, f := range []struct {
				name string
				text []byte
			}{{"type", e.Type}, {"data", e.Data}, {"metadata", e.Metadata}} {
				if why := checkJSONText(f.text, false); why != "" {
					return &InvalidEventError{Event: i + 1, Field: f.name, Reason: why}
				}
			}
		}
	}
	return invalidf("append to stream %q: its events %s", stream, why)
}
