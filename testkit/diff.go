package testkit

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"
)

// valueDiff walks two values side by side and returns the first place where
// they differ: its path from the top ("" for the top, ".Field", "[2]",
// "[\"key\"]") and the two values there; differ is false when they are
// equal.
//
// In strict mode equality is reflect.DeepEqual's, so that the walk explains
// a difference DeepEqual found; a struct whose fields are all unexported
// (time.Time) is compared, and named, whole, as it is printed whole. In
// wire mode two values are
// equal when the store cannot tell them apart: every field counts, also
// those JSON leaves out (the round-trip check names those), but a value
// whose type encodes itself (json.Marshaler or encoding.TextMarshaler:
// time.Time, json.RawMessage, decimals) is equal to another with the same
// encoding, so a time equals itself in another zone or without its
// monotonic reading, and a nil and an empty slice or map are equal in a
// struct field tagged omitempty (or omitzero), which leaves both out.
func valueDiff(a, b reflect.Value, wire bool) (path string, av, bv reflect.Value, differ bool) {
	w := differ_{wire: wire, seen: map[visit]bool{}}
	return w.diff("", a, b, 0, false)
}

type visit struct {
	a, b uintptr
	t    reflect.Type
}

// differ_ is one walk of valueDiff.
type differ_ struct {
	wire bool
	seen map[visit]bool // pointer pairs being compared, against cycles
}

// maxDiffDepth bounds the walk; deeper values are compared whole.
const maxDiffDepth = 64

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// diff compares a and b at path; omitted says they are a struct field's
// values that JSON leaves out when empty (omitempty, omitzero).
func (w *differ_) diff(path string, a, b reflect.Value, depth int, omitted bool) (string, reflect.Value, reflect.Value, bool) {
	if !a.IsValid() || !b.IsValid() {
		return path, a, b, a.IsValid() != b.IsValid()
	}
	if a.Type() != b.Type() {
		return path, a, b, true
	}
	if depth > maxDiffDepth {
		if a.CanInterface() && b.CanInterface() {
			return path, a, b, !reflect.DeepEqual(a.Interface(), b.Interface())
		}
		return path, a, b, false
	}
	if w.wire && encodesItself(a.Type()) && a.CanInterface() && b.CanInterface() {
		ja, erra := marshalValue(a)
		jb, errb := marshalValue(b)
		if erra == nil && errb == nil {
			return path, a, b, !bytes.Equal(ja, jb)
		}
	}
	if !w.wire && a.Kind() == reflect.Struct && !hasExportedField(a.Type()) && a.CanInterface() && b.CanInterface() {
		return path, a, b, !reflect.DeepEqual(a.Interface(), b.Interface())
	}
	// A nil and an empty slice or map are stored alike (and so equal on
	// the wire) only where the field is left out when empty; elsewhere one
	// is null, the other [] or {}.
	nilIsEmpty := w.wire && omitted
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			return path, a, b, a.IsNil() != b.IsNil()
		}
		if a.Pointer() == b.Pointer() {
			return path, a, b, false
		}
		v := visit{a.Pointer(), b.Pointer(), a.Type()}
		if w.seen[v] {
			return path, a, b, false
		}
		w.seen[v] = true
		return w.diff(path, a.Elem(), b.Elem(), depth+1, false)
	case reflect.Interface:
		if a.IsNil() || b.IsNil() {
			return path, a, b, a.IsNil() != b.IsNil()
		}
		return w.diff(path, a.Elem(), b.Elem(), depth+1, false)
	case reflect.Struct:
		for i := range a.NumField() {
			f := a.Type().Field(i)
			if p, da, db, d := w.diff(path+"."+f.Name, a.Field(i), b.Field(i), depth+1, omittedWhenEmpty(f)); d {
				return p, da, db, true
			}
		}
		return path, a, b, false
	case reflect.Slice:
		if a.Len() == 0 && b.Len() == 0 {
			return path, a, b, !nilIsEmpty && a.IsNil() != b.IsNil()
		}
		if a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return path, a, b, true
		}
		if a.Pointer() == b.Pointer() {
			return path, a, b, false
		}
		fallthrough
	case reflect.Array:
		if a.Len() != b.Len() {
			return path, a, b, true
		}
		for i := range a.Len() {
			if p, da, db, d := w.diff(fmt.Sprintf("%s[%d]", path, i), a.Index(i), b.Index(i), depth+1, false); d {
				return p, da, db, true
			}
		}
		return path, a, b, false
	case reflect.Map:
		if a.Len() == 0 && b.Len() == 0 {
			return path, a, b, !nilIsEmpty && a.IsNil() != b.IsNil()
		}
		if a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return path, a, b, true
		}
		if a.Pointer() == b.Pointer() {
			return path, a, b, false
		}
		for _, k := range sortedKeys(a) {
			kp := fmt.Sprintf("%s[%s]", path, renderV(k))
			bv := b.MapIndex(k)
			if !bv.IsValid() {
				return kp, a.MapIndex(k), bv, true
			}
			if p, da, db, d := w.diff(kp, a.MapIndex(k), bv, depth+1, false); d {
				return p, da, db, true
			}
		}
		return path, a, b, false
	case reflect.Func:
		// DeepEqual: equal only when both are nil.
		return path, a, b, !a.IsNil() || !b.IsNil()
	case reflect.Bool:
		return path, a, b, a.Bool() != b.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return path, a, b, a.Int() != b.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return path, a, b, a.Uint() != b.Uint()
	case reflect.Float32, reflect.Float64:
		return path, a, b, a.Float() != b.Float()
	case reflect.Complex64, reflect.Complex128:
		return path, a, b, a.Complex() != b.Complex()
	case reflect.String:
		return path, a, b, a.String() != b.String()
	case reflect.Chan, reflect.UnsafePointer:
		return path, a, b, a.Pointer() != b.Pointer()
	}
	return path, a, b, false
}

// omittedWhenEmpty reports whether encoding/json leaves field f out when it
// is empty (json:",omitempty") or zero (json:",omitzero").
func omittedWhenEmpty(f reflect.StructField) bool {
	_, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
	for opt := range strings.SplitSeq(opts, ",") {
		if opt == "omitempty" || opt == "omitzero" {
			return true
		}
	}
	return false
}

// encodesItself reports whether t (or *t) chooses its own JSON encoding.
func encodesItself(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return t.Implements(jsonMarshaler) || p.Implements(jsonMarshaler) ||
		t.Implements(textMarshaler) || p.Implements(textMarshaler)
}

// marshalValue encodes v as encoding/json would encode it as a field: an
// addressable copy, so that methods on the pointer are used.
func marshalValue(v reflect.Value) ([]byte, error) {
	p := reflect.New(v.Type())
	p.Elem().Set(v)
	return json.Marshal(p.Interface())
}

// render prints an event for a failure message: like %+v, but strings are
// quoted, pointers show what they point to (&{…}, nil), a nil slice or
// map (nil) is told from an empty one ([] or map[]), and a time.Time shows
// its location, so that two events that differ print differently. (Not
// always: a NaN differs from itself, and a type with only unexported
// fields is printed by its String or Error method, which may leave some
// of its state out; the line naming the first difference says where.)
func render(v any) string { return renderV(reflect.ValueOf(v)) }

func renderV(v reflect.Value) string {
	var b strings.Builder
	renderValue(&b, v, 0)
	return b.String()
}

func renderValue(b *strings.Builder, v reflect.Value, depth int) {
	if !v.IsValid() {
		b.WriteString("nil")
		return
	}
	if depth > maxDiffDepth {
		b.WriteString("…")
		return
	}
	// A value whose state is all private (time.Time, netip.Addr) is shown
	// as it prints itself: its fields would say nothing.
	if v.Kind() == reflect.Struct && v.CanInterface() && !hasExportedField(v.Type()) {
		switch x := v.Interface().(type) {
		case time.Time:
			b.WriteString(renderTime(x))
			return
		case error:
			b.WriteString(x.Error())
			return
		case fmt.Stringer:
			b.WriteString(x.String())
			return
		}
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			b.WriteString("nil")
			return
		}
		b.WriteString("&")
		renderValue(b, v.Elem(), depth+1)
	case reflect.Interface:
		if v.IsNil() {
			b.WriteString("nil")
			return
		}
		renderValue(b, v.Elem(), depth+1)
	case reflect.Struct:
		b.WriteString("{")
		for i := range v.NumField() {
			if i > 0 {
				b.WriteString(" ")
			}
			b.WriteString(v.Type().Field(i).Name)
			b.WriteString(":")
			renderValue(b, v.Field(i), depth+1)
		}
		b.WriteString("}")
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			b.WriteString("nil")
			return
		}
		b.WriteString("[")
		for i := range v.Len() {
			if i > 0 {
				b.WriteString(" ")
			}
			renderValue(b, v.Index(i), depth+1)
		}
		b.WriteString("]")
	case reflect.Map:
		if v.IsNil() {
			b.WriteString("nil")
			return
		}
		b.WriteString("map[")
		for i, k := range sortedKeys(v) {
			if i > 0 {
				b.WriteString(" ")
			}
			renderValue(b, k, depth+1)
			b.WriteString(":")
			renderValue(b, v.MapIndex(k), depth+1)
		}
		b.WriteString("]")
	case reflect.String:
		fmt.Fprintf(b, "%q", v.String())
	default:
		fmt.Fprintf(b, "%v", v)
	}
}

// renderTime prints t as its String does, followed by the name of its
// location unless that is UTC or unnamed: String shows only the zone's
// abbreviation and offset, alike for time.Local where it is UTC and
// time.UTC, or for Europe/Berlin and a fixed zone named CET, which
// reflect.DeepEqual tells apart ("… +0100 CET (Europe/Berlin)", "… +0000
// UTC (Local)"). A monotonic reading shows as String shows it (m=±…).
func renderTime(t time.Time) string {
	s := t.String()
	if loc := t.Location(); loc != time.UTC && loc.String() != "" {
		s += " (" + loc.String() + ")"
	}
	return s
}

func hasExportedField(t reflect.Type) bool {
	for i := range t.NumField() {
		if t.Field(i).IsExported() {
			return true
		}
	}
	return false
}

// sortedKeys returns a map's keys in the order of their rendering.
func sortedKeys(m reflect.Value) []reflect.Value {
	keys := m.MapKeys()
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = renderV(k)
	}
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool { return names[idx[i]] < names[idx[j]] })
	out := make([]reflect.Value, len(keys))
	for i, k := range idx {
		out[i] = keys[k]
	}
	return out
}

// renderLeaf prints one side of a difference: the value, with its type
// when the other side's type is another.
func renderLeaf(v, other reflect.Value) string {
	if !v.IsValid() {
		return "nothing"
	}
	s := renderV(v)
	if !other.IsValid() || other.Type() != v.Type() {
		return v.Type().String() + " " + s
	}
	return s
}
