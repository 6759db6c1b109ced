package eventstore

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"reflect"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
)

// PersonalTag is the struct tag value that marks a top-level field of an
// event type as personal data: `annals:"personal"`.
const PersonalTag = "personal"

// Forgotten is what a personal string field reads as once its subject is
// forgotten (Store.Forget). Personal fields of other kinds (numbers, bools,
// objects, arrays) read as JSON null, which decodes to Go's zero value.
const Forgotten = "[forgotten]"

// personalKey is the JSON key of an encrypted field's envelope.
const personalKey = "$personal"

var personalMarker = []byte(`"` + personalKey + `"`)

// readKeyTimeout bounds a key look-up made by a decode (which has no context).
const readKeyTimeout = 30 * time.Second

// RegisterOption configures a registration (Register).
type RegisterOption func(*registration) error

type registration struct {
	subjectField string // Go field name
}

// PersonalData declares that events of the registered type carry personal
// data of the subject named by the Go field subjectField (a string or
// integer field, or a UUID, e.g. a customer ID: it stays in clear, so make
// it an opaque ID, not a name or an e-mail address; an append whose subject
// is missing or its field's zero value, "", 0 or the nil UUID, which is what
// an unset field holds, is refused with an *InvalidEventError, since it
// would put every such event's data under one subject). The type's top-level
// fields tagged `annals:"personal"` are encrypted, before each append, with
// the subject's data key (AES-256-GCM, the subject and field name bound as
// additional data; a random nonce per field, or, for an event whose ID the
// caller chose, a nonce derived from the data key, the event ID, the field
// and its value, so that a retried append seals to the same bytes and is
// recognised as stored: idempotency holds for personal data too) and stored
// as
// {"$personal": {"v": 1, "subject": ..., "kind": ..., "data": base64}};
// reads decrypt them back. After Store.Forget(subject) they read as
// Forgotten (strings) or null (other kinds: Go's zero value). A Store needs
// Config.KEK to append such events. Only fields declared in the type itself
// are encrypted: to make a nested value personal, tag the top-level field
// that holds it (it is encrypted whole). Register refuses, for any type, a
// personal tag on a field of a nested struct (or of slice, array or map
// elements) or one promoted from an embedded struct, and an annals tag
// other than "personal": such tags would leave the field in clear.
func PersonalData(subjectField string) RegisterOption {
	return func(r *registration) error {
		if subjectField == "" {
			return errors.New("PersonalData: the subject field name is empty")
		}
		r.subjectField = subjectField
		return nil
	}
}

// personalSpec is what the registry knows of a type with personal data:
// JSON names of the subject field and of the personal fields.
type personalSpec struct {
	subject string
	fields  []string
	// unset is the subject as the type's zero value encodes it (for a
	// field tagged `json:",string"` or of a type with its own MarshalJSON,
	// not "", 0 or the nil UUID): an unset subject field, refused as
	// subjectOf's zero values are ("" when it could not be told).
	unset string
}

// jsonName returns the JSON key encoding/json uses for f, or "" when it
// does not encode it.
func jsonName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	tag := f.Tag.Get("json")
	if tag == "-" {
		return ""
	}
	if name, _, _ := strings.Cut(tag, ","); name != "" {
		return name
	}
	return f.Name
}

// personalSpecOf builds t's spec from its tags and the options; nil when the
// type has no personal data.
func personalSpecOf(t reflect.Type, o registration) (*personalSpec, error) {
	var fields []string
	if t.Kind() == reflect.Struct {
		if err := checkNestedTags(t); err != nil {
			return nil, err
		}
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Tag.Get("annals") != PersonalTag {
				continue
			}
			name := jsonName(f)
			if name == "" || f.Anonymous {
				return nil, invalidf("%s.%s is tagged personal but is not a named top-level field that encoding/json writes", t, f.Name)
			}
			if f.Name == o.subjectField {
				return nil, invalidf("%s.%s is the subject ID of PersonalData and cannot be personal itself", t, f.Name)
			}
			fields = append(fields, name)
		}
	}
	switch {
	case o.subjectField == "" && len(fields) == 0:
		return nil, nil
	case o.subjectField == "":
		return nil, invalidf("%s has fields tagged personal: register it with eventstore.PersonalData(subject field)", t)
	case len(fields) == 0:
		return nil, invalidf("%s is registered with PersonalData but has no field tagged `annals:\"personal\"`", t)
	}
	f, ok := t.FieldByName(o.subjectField)
	if !ok || len(f.Index) != 1 || jsonName(f) == "" {
		return nil, invalidf("PersonalData: %s has no top-level field %q that encoding/json writes", t, o.subjectField)
	}
	switch f.Type.Kind() {
	case reflect.String, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Array:
	default:
		return nil, invalidf("PersonalData: the subject field %s.%s is a %s; want a string, an integer or a UUID", t, f.Name, f.Type)
	}
	spec := &personalSpec{subject: jsonName(f), fields: fields}
	spec.unset = unsetSubject(t, spec.subject)
	return spec, nil
}

// unsetSubject returns the subject ID that t's zero value encodes under the
// JSON key subject ("" when it encodes none, or cannot be encoded: a
// MarshalJSON that fails, or panics, on a zero value).
func unsetSubject(t reflect.Type, subject string) (unset string) {
	if t.Kind() != reflect.Struct {
		return ""
	}
	defer func() {
		if recover() != nil {
			unset = ""
		}
	}()
	var obj map[string]json.RawMessage
	b, err := json.Marshal(reflect.New(t).Elem().Interface())
	if err != nil || json.Unmarshal(b, &obj) != nil {
		return ""
	}
	s, _ := subjectOf(obj[subject])
	return s
}

// checkNestedTags refuses `annals` tags that would encrypt nothing: a value
// other than "personal" (`annals:"personal,omitempty"`), and a personal tag
// on a field that is not declared in t itself (a field of a nested struct,
// of the elements of a slice, array or map, or one promoted from an
// embedded struct), unless a top-level field tagged personal holds it (it
// is encrypted whole then). Only t's own top-level fields are encrypted, so
// such a tag left the field in clear, out of Forget's reach, with no error.
// That holds for t reached again below its top level (a recursive type's
// children): only the outermost value's fields are encrypted, so t is not
// marked seen before the walk, and each type is walked once.
func checkNestedTags(t reflect.Type) error {
	seen := map[reflect.Type]bool{}
	var walk func(typ reflect.Type, path string, embedded bool) error
	walk = func(typ reflect.Type, path string, embedded bool) error {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Array || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || seen[typ] {
			return nil
		}
		seen[typ] = true
		for i := range typ.NumField() {
			f := typ.Field(i)
			if tag, ok := f.Tag.Lookup("annals"); ok {
				switch {
				case tag != PersonalTag:
					return invalidf("%s.%s has the tag annals:%q; the only annals tag is annals:%q", path, f.Name, tag, PersonalTag)
				case embedded:
					return invalidf("%s.%s is tagged personal but is promoted from an embedded struct; only fields declared in %s itself are encrypted: declare it there", path, f.Name, t)
				default:
					return invalidf("%s.%s is tagged personal but is nested; only the top-level fields of %s are encrypted: tag the top-level field that holds it (it is encrypted whole)", path, f.Name, t)
				}
			}
			if err := walk(f.Type, path+"."+f.Name, embedded && f.Anonymous); err != nil {
				return err
			}
		}
		return nil
	}
	for i := range t.NumField() {
		f := t.Field(i)
		tag, ok := f.Tag.Lookup("annals")
		switch {
		case ok && tag != PersonalTag:
			return invalidf("%s.%s has the tag annals:%q; the only annals tag is annals:%q", t, f.Name, tag, PersonalTag)
		case ok:
			continue // encrypted whole: tags inside it change nothing
		}
		if err := walk(f.Type, t.String()+"."+f.Name, f.Anonymous); err != nil {
			return err
		}
	}
	return nil
}

func (r *Registry) personalSpec(name string) *personalSpec {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.personal[name]
}

// envelope is an encrypted field as stored.
type envelope struct {
	Personal *envelopeBody `json:"$personal"`
}

type envelopeBody struct {
	V       int    `json:"v"`
	Subject string `json:"subject"`
	Kind    string `json:"kind"`
	Data    string `json:"data"`
}

func fieldAAD(subject, field string) []byte {
	return []byte("annals-pd-v1\x00" + subject + "\x00" + field)
}

func jsonKind(raw json.RawMessage) string {
	switch t := bytes.TrimLeft(raw, " \t\r\n"); {
	case len(t) == 0:
		return "null"
	case t[0] == '"':
		return "string"
	case t[0] == '{':
		return "object"
	case t[0] == '[':
		return "array"
	case t[0] == 't' || t[0] == 'f':
		return "bool"
	case t[0] == 'n':
		return "null"
	}
	return "number"
}

// subjectOf returns the subject ID held in raw (a JSON string or number):
// not one when it is missing or Go's zero value of its field (an empty
// string, the number 0, the nil UUID), which is what an unset field holds.
// Such a subject would gather every event whose field was left unset under
// one data key: a Forget of any of their people would forget them all, and
// none could be forgotten alone.
func subjectOf(raw json.RawMessage) (string, bool) {
	switch jsonKind(raw) {
	case "string":
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, s != "" && s != uuid.Nil.String()
	case "number":
		n := string(bytes.TrimSpace(raw))
		var f float64
		if json.Unmarshal(raw, &f) == nil && f == 0 {
			return n, false
		}
		return n, true
	}
	return "", false
}

// seal encrypts the personal fields of data, event n (1-based) of type
// name; data of a type without personal data is returned as is.
func (r *Registry) seal(ctx context.Context, n int, name string, id uuid.UUID, data []byte) ([]byte, error) {
	spec := r.personalSpec(name)
	if spec == nil {
		return data, nil
	}
	k := r.keys.Load()
	if k == nil || k.kek == nil {
		return nil, errors.Wrapf(ErrNoKEK, "event %d (%s) has personal data", n, name)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, &InvalidEventError{Event: n, Field: "data", Reason: "holds personal data, so it must be a JSON object"}
	}
	subject, ok := subjectOf(obj[spec.subject])
	if !ok || subject == spec.unset {
		return nil, &InvalidEventError{Event: n, Field: "data", Reason: "the subject ID " + spec.subject + " of its personal data is missing or empty (an unset field: its type's zero value, such as \"\", 0 or the nil UUID)"}
	}
	if len(subject) > 1024 {
		return nil, &InvalidEventError{Event: n, Field: "data", Reason: "the subject ID " + spec.subject + " is over 1024 bytes"}
	}
	var key subjectKey
	for _, f := range spec.fields {
		raw, ok := obj[f]
		if !ok || jsonKind(raw) == "null" {
			continue
		}
		if key.aead == nil {
			var err error
			if key, err = k.lookup(ctx, subject, true); err != nil {
				return nil, err
			}
			if key.forgotten {
				return nil, errors.Wrapf(ErrSubjectForgotten, "event %d (%s): subject %q", n, name, subject)
			}
		}
		var (
			ct  []byte
			err error
		)
		if id != uuid.Nil {
			// A caller-chosen ID: the append may be retried, and a retry
			// must seal to the same bytes to be recognised as stored.
			ct = sealGCMFor(key.aead, key.nonceKey, id, f, raw, fieldAAD(subject, f))
		} else if ct, err = sealGCM(key.aead, raw, fieldAAD(subject, f)); err != nil {
			return nil, err
		}
		b, err := json.Marshal(envelope{Personal: &envelopeBody{V: 1, Subject: subject, Kind: jsonKind(raw),
			Data: base64.StdEncoding.EncodeToString(ct)}})
		if err != nil {
			return nil, errors.WithStack(err)
		}
		obj[f] = b
	}
	out, err := json.Marshal(obj)
	return out, errors.WithStack(err)
}

// parseEnvelope returns raw's envelope, if raw is one. It reads the keys as
// forget_subject and the scavenger do (jsonb: exact keys, the last of a key
// given twice): an object whose key is exactly "$personal", holding one
// whose key "subject" is exactly that. encoding/json's struct decoding would
// also take "$Personal" or "Subject" (it matches keys case-insensitively):
// an envelope so spelled, which no annals client writes, would be
// decrypted, and its stream missed by a Forget of its subject, which then
// left the stream's snapshots (its data decrypted) in place.
func parseEnvelope(raw json.RawMessage) (*envelopeBody, bool) {
	if !bytes.Contains(raw, personalMarker) || jsonKind(raw) != "object" {
		return nil, false
	}
	var outer map[string]json.RawMessage
	if json.Unmarshal(raw, &outer) != nil {
		return nil, false
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(outer[personalKey], &fields) != nil || fields == nil {
		return nil, false
	}
	var body envelopeBody
	for key, dst := range map[string]any{"v": &body.V, "subject": &body.Subject, "kind": &body.Kind, "data": &body.Data} {
		if v, ok := fields[key]; ok && json.Unmarshal(v, dst) != nil {
			return nil, false
		}
	}
	if body.V != 1 || body.Subject == "" {
		return nil, false
	}
	return &body, true
}

// redacted is the JSON a forgotten field of kind reads as.
func redacted(kind string) json.RawMessage {
	if kind == "string" {
		return json.RawMessage(`"` + Forgotten + `"`)
	}
	return json.RawMessage(`null`)
}

// reveal returns e with its encrypted fields decrypted, or redacted when
// their subject is forgotten. Without a KEK, fields of subjects not
// forgotten stay encrypted. Events without personal data are returned as is.
func (r *Registry) reveal(e Event) (Event, error) {
	if r == nil {
		return e, nil
	}
	k := r.keys.Load()
	if k == nil || !bytes.Contains(e.Data, personalMarker) {
		return e, nil
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(e.Data, &obj) != nil {
		return e, nil
	}
	changed := false
	for f, raw := range obj {
		env, ok := parseEnvelope(raw)
		if !ok {
			continue
		}
		key, ok := k.cached(env.Subject)
		if !ok {
			ctx, cancel := context.WithTimeout(context.Background(), readKeyTimeout)
			var err error
			key, err = k.lookup(ctx, env.Subject, false)
			cancel()
			if err != nil {
				return e, errors.Wrapf(err, "event %d", e.GlobalSequence)
			}
		}
		switch {
		case key.forgotten:
			obj[f] = redacted(env.Kind)
		case key.aead != nil:
			ct, err := base64.StdEncoding.DecodeString(env.Data)
			n := key.aead.NonceSize()
			if err != nil || len(ct) < n {
				return e, errors.Wrapf(ErrDecrypt, "event %d field %q: malformed ciphertext", e.GlobalSequence, f)
			}
			plain, err := key.aead.Open(nil, ct[:n], ct[n:], fieldAAD(env.Subject, f))
			if err != nil {
				return e, errors.Wrapf(ErrDecrypt, "event %d field %q of subject %q", e.GlobalSequence, f, env.Subject)
			}
			obj[f] = plain
		default:
			continue // no KEK: stays encrypted
		}
		changed = true
	}
	if !changed {
		return e, nil
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return e, errors.Wrapf(ErrDecrypt, "event %d: %v", e.GlobalSequence, err)
	}
	e.Data = b
	return e, nil
}
