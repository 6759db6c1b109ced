package eventstore

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Input limits, in bytes (UTF-8). The same limits are checked by the Go client
// before any round trip and by the SQL function check_event_input, which
// append_events calls, for producers that call the SQL function directly
// (docs/sql-api.md). A rejection is an *InvalidEventError, which matches
// ErrInvalidEvent, and nothing is written.
const (
	// MaxStreamIDBytes is the longest stream ID. Stream IDs are keys of
	// B-tree indexes, whose entries PostgreSQL caps at about 2,700 bytes; 512
	// leaves room for the version beside it and for any tenant or category
	// prefix an application adds, and keeps the indexes small.
	MaxStreamIDBytes = 512
	// MaxEventTypeBytes is the longest event type name.
	MaxEventTypeBytes = 256
	// MaxMetadataKeyBytes is the longest key of an event's metadata object
	// (top-level keys; nested objects are the application's).
	MaxMetadataKeyBytes = 256
	// MaxEventBytesLimit is the largest value Config.MaxEventBytes may take,
	// and the limit check_event_input applies in SQL to one event's data
	// plus metadata as PostgreSQL stores them (its normalized JSON text,
	// which may differ in size from the JSON the client sent). PostgreSQL's
	// own limit on a jsonb argument is 256 MiB for the whole append.
	MaxEventBytesLimit = 64 << 20
)

// Metadata keys that annals writes and reads itself. They are reserved: in
// Metadata.Extra, correlation_id and causation_id are refused (set the
// CorrelationID and CausationID fields instead, which are written under
// those keys), schema_version must be a positive integer (SchemaVersionKey)
// and traceparent and tracestate (the W3C trace context an append stores)
// must be strings. The SQL function checks the same types.
const (
	correlationKey = "correlation_id"
	causationKey   = "causation_id"
	traceparentKey = "traceparent"
	tracestateKey  = "tracestate"
)

// InvalidEventError reports input that annals refuses, with the field at
// fault and, for a size limit, the limit and the actual size. It matches
// ErrInvalidEvent (errors.Is); nothing was written.
type InvalidEventError struct {
	// Event is the 1-based position of the offending event in the append,
	// or 0 when the fault is in the append as a whole (stream ID, expected
	// version).
	Event int
	// Field names what is at fault: "stream_id", "expected_version",
	// "type", "data", "metadata", or "data+metadata" for the size of an
	// event; for SetStreamRetention, "retention", "max_age" or
	// "truncate_before".
	Field string
	// Reason says what is wrong with Field, e.g. "is 3000 bytes; the
	// limit is 512" or "the subject ID customer_id of its personal data is
	// missing or empty". Error() writes it after the field and a colon.
	Reason string
	// Limit is the limit that was exceeded, or 0: a size in bytes for an
	// event's fields; for SetStreamRetention, the largest max_age in
	// seconds ("max_age") or the stream's current truncate-before version,
	// which the one asked for is below ("truncate_before").
	Limit int
	// Actual is the offending value in the same unit when Limit is set, or
	// 0.
	Actual int

	sqlMessage bool // Reason is the SQL function's whole message
}

func (e *InvalidEventError) Error() string {
	switch {
	case e.sqlMessage:
		return ErrInvalidEvent.Error() + ": " + e.Reason
	case e.Event > 0:
		return fmt.Sprintf("%s: event %d: %s: %s", ErrInvalidEvent, e.Event, e.Field, e.Reason)
	}
	return fmt.Sprintf("%s: %s: %s", ErrInvalidEvent, e.Field, e.Reason)
}

// Is makes errors.Is match ErrInvalidEvent.
func (e *InvalidEventError) Is(target error) bool { return target == ErrInvalidEvent }

// tooLong returns the error of a field of n bytes over limit.
func tooLong(event int, field string, n, limit int) *InvalidEventError {
	return &InvalidEventError{Event: event, Field: field, Limit: limit, Actual: n,
		Reason: "is " + strconv.Itoa(n) + " bytes; the limit is " + strconv.Itoa(limit)}
}

// CheckStreamID reports whether an append would take streamID as a stream
// ID: not empty, at most MaxStreamIDBytes bytes, valid UTF-8, without
// control characters and not only whitespace. A refusal is the
// *InvalidEventError (field "stream_id") the append would return. It lets
// code that derives stream IDs from user input (an aggregate's ID, a tenant)
// refuse a bad one before it reads or writes anything.
func CheckStreamID(streamID string) error {
	return checkName(0, "stream_id", streamID, MaxStreamIDBytes)
}

// checkName checks a stream ID or event type: not empty, at most limit
// bytes, valid UTF-8, no control characters (C0, DEL, C1; NUL included) and
// not only whitespace. It allocates nothing when s is fine.
func checkName(event int, field, s string, limit int) error {
	switch {
	case s == "":
		return &InvalidEventError{Event: event, Field: field, Reason: "is empty"}
	case len(s) > limit:
		return tooLong(event, field, len(s), limit)
	}
	blank := true
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return &InvalidEventError{Event: event, Field: field,
					Reason: "contains the control character " + strconv.QuoteRune(rune(c)) + " at byte " + strconv.Itoa(i)}
			}
			blank = blank && c == ' '
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return &InvalidEventError{Event: event, Field: field, Reason: "is not valid UTF-8 at byte " + strconv.Itoa(i)}
		case r <= 0x9f:
			return &InvalidEventError{Event: event, Field: field,
				Reason: "contains the control character " + strconv.QuoteRune(r) + " at byte " + strconv.Itoa(i)}
		}
		blank = blank && unicode.IsSpace(r)
		i += size
	}
	if blank {
		return &InvalidEventError{Event: event, Field: field, Reason: "is only whitespace"}
	}
	return nil
}

// checkExpected checks an expected version for an append of n events: Any,
// NoStream, StreamExists, or a version to which n can be added without
// overflowing a bigint.
func checkExpected(v ExpectedVersion, n int) error {
	if v < Any || (v > 0 && int64(v) > math.MaxInt64-int64(n)) {
		return &InvalidEventError{Field: "expected_version",
			Reason: "is " + strconv.FormatInt(int64(v), 10) + "; it must be Any, NoStream, StreamExists or a version >= 1 that the append's events do not overflow"}
	}
	return nil
}

// checkMetadata checks the keys of m.Extra: their length and the reserved keys.
func checkMetadata(event int, m Metadata) error {
	for k, v := range m.Extra {
		if len(k) > MaxMetadataKeyBytes {
			e := tooLong(event, "metadata", len(k), MaxMetadataKeyBytes)
			e.Reason = "key " + strconv.Quote(k[:32]) + "... " + e.Reason
			return e
		}
		switch k {
		case correlationKey, causationKey:
			return &InvalidEventError{Event: event, Field: "metadata",
				Reason: "key " + strconv.Quote(k) + " is reserved for the " + strings.TrimSuffix(k, "_id") + " ID and must be a string (in Go: Metadata.CorrelationID or Metadata.CausationID, not Extra)"}
		case traceparentKey, tracestateKey:
			if _, ok := v.(string); !ok {
				return &InvalidEventError{Event: event, Field: "metadata",
					Reason: "key " + strconv.Quote(k) + " is reserved for the W3C trace context and must be a string"}
			}
		}
	}
	return nil
}

// checkJSONText returns what PostgreSQL's jsonb cannot take in the valid JSON
// b: a \u0000 escape (text cannot hold NUL) or an unpaired UTF-16 surrogate
// escape. When marshalled is set (b is encoding/json's output), a \ufffd
// escape is refused too: it is what encoding/json writes in place of invalid
// UTF-8 in a Go string, which would otherwise be stored altered. It returns
// "" for fine input, and costs one IndexByte scan when b has no backslash.
func checkJSONText(b []byte, marshalled bool) string {
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\\')
		if j < 0 {
			return ""
		}
		i += j
		if i+1 >= len(b) || b[i+1] != 'u' {
			i += 2
			continue
		}
		h, ok := hex4(b, i+2)
		switch {
		case !ok:
			return "holds a malformed \\u escape"
		case h == 0:
			return `holds the escape \u0000: PostgreSQL cannot store NUL characters`
		case h == 0xfffd && marshalled:
			return `holds a Go string that is not valid UTF-8 (encoding/json wrote \ufffd in its place)`
		case h >= 0xd800 && h <= 0xdbff:
			if lo, ok := hex4(b, i+8); ok && b[i+6] == '\\' && b[i+7] == 'u' && lo >= 0xdc00 && lo <= 0xdfff {
				i += 12
				continue
			}
			return "holds an unpaired UTF-16 surrogate escape"
		case h >= 0xdc00 && h <= 0xdfff:
			return "holds an unpaired UTF-16 surrogate escape"
		}
		i += 6
	}
}

// hex4 decodes the four hex digits at b[i:i+4].
func hex4(b []byte, i int) (int, bool) {
	if i < 0 || i+4 > len(b) {
		return 0, false
	}
	v := 0
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | int(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | int(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | int(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}
