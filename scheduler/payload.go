package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
)

// A timer's payload is its eventstore.EncodedAppend as JSON, stored in
// timers.payload_json (json, since migration 0033: the text as written, byte
// for byte). A timer stored before 0033 keeps its payload in the jsonb column
// payload (and payload_json NULL); the scheduler reads whichever is set. When
// the timer fires, the append goes through append_events_json (migration
// 0035), which stores each event's data and metadata as the payload holds
// them, as every append made in a transaction (Transact, AppendTx) does: a
// timer stored before 0033 holds, and appends, jsonb's rendering.

// encodePayload returns enc as a timer's payload, with enc.Events as it is,
// byte for byte. json.Marshal would compact it and escape <, > and & in its
// strings (six bytes for one), so that an event at Config.MaxEventBytes
// when it was encoded could be over it when the timer fires, where the
// encoded append is measured again. It is a json.RawMessage, not a []byte:
// pgx sends a []byte as bytea text ("\x7b...") in the query exec modes that
// do not describe the statement first (QueryExecModeExec and
// QueryExecModeSimpleProtocol), which the json column refuses.
func encodePayload(enc eventstore.EncodedAppend) (json.RawMessage, error) {
	head, err := json.Marshal(struct {
		StreamID string                     `json:"stream_id"`
		Expected eventstore.ExpectedVersion `json:"expected"`
		Count    int                        `json:"count"`
	}{enc.StreamID, enc.Expected, enc.Count})
	if err != nil {
		return nil, errors.Wrap(err, "scheduler: encode timer")
	}
	out := make([]byte, 0, len(head)+len(`,"events":`)+len(enc.Events))
	out = append(out, head[:len(head)-1]...) // without its closing brace
	out = append(out, `,"events":`...)
	out = append(out, enc.Events...)
	return append(out, '}'), nil
}

// maxSafeNumberBytes is the longest JSON number that numeric (and so jsonb)
// holds whatever its digits, provided its exponent has at most four digits:
// numeric takes up to 16383 digits after the point and 131072 before it,
// counting the exponent, and 6384 + 9999 = 16383 (migration 0032 reasons
// the same way).
const maxSafeNumberBytes = 6384

// mayOverflowNumeric reports whether the JSON text b may hold a number that
// jsonb cannot: one with an exponent of five digits or more (1e200000), or
// one longer than maxSafeNumberBytes. false means jsonb holds every number
// of b. Numbers inside strings do not count.
func mayOverflowNumeric(b []byte) bool {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++ // the escaped character, a quote included
				}
			}
		case c == '-' || (c >= '0' && c <= '9'):
			start, expDigits := i, -1
			for ; i < len(b) && strings.IndexByte("0123456789+-.eE", b[i]) >= 0; i++ {
				switch {
				case b[i] == 'e' || b[i] == 'E':
					expDigits = 0
				case expDigits >= 0 && b[i] >= '0' && b[i] <= '9':
					expDigits++
				}
			}
			if expDigits >= 5 || i-start > maxSafeNumberBytes {
				return true
			}
			i-- // the loop's i++ steps onto the byte after the number
		}
	}
	return false
}

// checkStorable refuses an encoded append whose events hold a number that
// jsonb cannot (beyond numeric's range: {"n": 1e200000}) where the append
// refuses one, so the timer would fail each time it fires: in metadata,
// which the append functions read as jsonb (22003), and in data holding
// "$personal" (personal data, which Forget and the scavenger read as
// jsonb) or a \u escape (ErrInvalidEvent: data_unstorable, migration 0032,
// asks jsonb of both). Other data holding such a number is appended as
// written (append_events_json, migration 0035), as Append and Transact
// store it. Go tells the numbers that may be out of range
// (mayOverflowNumeric); PostgreSQL decides for those (jsonb_storable, which
// answers rather than raises, so a caller's tx goes on).
func (s *Scheduler) checkStorable(ctx context.Context, tx pgx.Tx, enc eventstore.EncodedAppend) error {
	if !mayOverflowNumeric(enc.Events) {
		return nil
	}
	var events []struct {
		Data     json.RawMessage `json:"data"`
		Metadata json.RawMessage `json:"metadata"`
	}
	if err := json.Unmarshal(enc.Events, &events); err != nil {
		return errors.Wrap(err, "scheduler: read the encoded events")
	}
	for i, e := range events {
		for _, f := range []struct {
			name string
			json json.RawMessage
		}{{"data", e.Data}, {"metadata", e.Metadata}} {
			if !mayOverflowNumeric(f.json) ||
				(f.name == "data" && !bytes.Contains(f.json, []byte(`"$personal"`)) && !bytes.Contains(f.json, []byte(`\u`))) {
				continue
			}
			var ok bool
			if err := s.db(tx).QueryRow(ctx, s.q.jsonbStorable, string(f.json)).Scan(&ok); err != nil {
				return errors.Wrap(err, "scheduler: check the timer's numbers")
			}
			if !ok {
				return &eventstore.InvalidEventError{Event: i + 1, Field: f.name,
					Reason: "holds a number beyond the range of PostgreSQL's numeric, which jsonb cannot hold: annals refuses one in metadata, and in data that holds \"$personal\" or a \\u escape"}
			}
		}
	}
	return nil
}
