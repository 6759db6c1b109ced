package testkit

import (
	"encoding/json"
	stderrors "errors"
	"fmt"
	"path/filepath"
	"reflect"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/eventstore"
)

// AggregateScenario is a Given/When/Then test of an aggregate, run in
// memory: Given the events already in its stream, When a command runs,
// Then it records these events (or ThenError: it fails so).
//
//	testkit.Given(t, NewAccount, Opened{Owner: "Ann"}, Deposited{Amount: 100}).
//		When(func(a *Account) error { return a.Withdraw(30) }).
//		Then(Withdrawn{Amount: 30})
//
// The history is applied with aggregate.FromHistory (Apply, as a load
// would), the command runs on the result, and the events it recorded
// (aggregate.Record) are compared with the expected ones with
// reflect.DeepEqual, in order (with WithRegistry, as the store would tell
// them apart: see there). A mismatch fails the test (t.Errorf) with
// both lists, one event a line (pointers shown as what they point to, a nil
// slice or map as nil, an empty one as [] or map[], a time.Time with its
// location unless that is UTC), the first difference
// marked and, within it, the first field that differs named. The scenario
// runs when Then or ThenError is called, once; a scenario that is never
// checked (Given and When without Then or ThenError) fails the test when it
// ends.
type AggregateScenario[A aggregate.Root] struct {
	t       testing.TB
	newAgg  func() A
	id      string
	reg     *eventstore.Registry
	history []any
	command func(A) error
	checked atomic.Bool // Then or ThenError was called
}

// Given starts a scenario for the aggregate newAgg returns, with the events
// of its history (none for a new aggregate; a pointer event is applied as
// the value it points to, as Record records it). Its ID is "test" unless
// WithID says otherwise. The scenario must end with Then or ThenError: if
// it does not, the test fails when it ends (t.Cleanup), naming where Given
// was called.
func Given[A aggregate.Root](t testing.TB, newAgg func() A, history ...any) *AggregateScenario[A] {
	t.Helper()
	s := &AggregateScenario[A]{t: t, newAgg: newAgg, id: "test", history: history}
	where := "an unknown line"
	if _, file, line, ok := runtime.Caller(1); ok {
		where = fmt.Sprintf("%s:%d", filepath.Base(file), line)
	}
	t.Cleanup(func() {
		if !s.checked.Load() {
			t.Errorf("testkit: %s: the scenario started at %s was never checked: end it with Then or ThenError", s.name(), where)
		}
	})
	return s
}

// WithID sets the aggregate's ID.
func (s *AggregateScenario[A]) WithID(id string) *AggregateScenario[A] {
	s.id = id
	return s
}

// WithRegistry makes the scenario use events as the store would: every
// history event is encoded to JSON and decoded through reg (upcasters
// included) before it is applied, and every recorded event must read back
// the same after that round trip, so an unregistered event type or a field
// that does not survive JSON (unexported, or tagged json:"-") fails the
// test, naming the event and the field. The recorded events are still
// compared with the expected ones as recorded, field by field (unexported
// fields included), but as the store would tell them apart: a value whose
// type encodes itself (time.Time) by its JSON encoding, and a nil and an
// empty slice or map as equal in a field tagged omitempty (or omitzero),
// which leaves both out. So a time the aggregate took from its history and
// put into a new event, which went through JSON as after a load and came
// back in another zone (a named or the Local zone) or without its monotonic
// reading (time.Now), still equals the time given. The same rules say what
// survives the round trip, and there the type counts too: a field of type
// any (or a map[string]any's value, an []any's element) must hold what
// encoding/json decodes into one — float64, string, bool, nil,
// map[string]any or []any — since an int in it reads back as a float64, a
// struct as a map[string]any, which fails the test. History
// events may then also be given as stored, in an older schema version:
//
//	eventstore.EventData{Type: "account.opened", Data: json.RawMessage(`{"name":"Ann"}`)}
//
// (without a schema_version in its Metadata such an event is at version 1).
// So may expected events, which are then compared as decoded.
func (s *AggregateScenario[A]) WithRegistry(reg *eventstore.Registry) *AggregateScenario[A] {
	s.reg = reg
	return s
}

// When sets the command: a function that calls the aggregate's command
// methods (which record events with aggregate.Record).
func (s *AggregateScenario[A]) When(command func(A) error) *AggregateScenario[A] {
	s.command = command
	return s
}

// Then runs the scenario and checks that the command succeeded and
// recorded exactly the expected events, in order (none: Then()). It returns
// the aggregate after the command, for checks of its state; on a failure
// that left no aggregate it returns the zero A.
func (s *AggregateScenario[A]) Then(expected ...any) A {
	s.t.Helper()
	a, recorded, err, ok := s.run()
	if !ok {
		return a
	}
	if err != nil {
		s.t.Errorf("testkit: %s: the command failed: %v\nexpected %s", s.name(), err, aggList(expected, -1))
		return a
	}
	expected = aggDeref(expected)
	var problems []string
	if s.reg != nil {
		// Expected events given as stored are compared as a read decodes
		// them; the others as given, against the events as recorded.
		for i, v := range expected {
			if _, stored := v.(eventstore.EventData); !stored {
				continue
			}
			dec, err := s.through(v, "expected", i+1)
			if err != nil {
				s.t.Errorf("testkit: %s: %v", s.name(), err)
				return a
			}
			expected[i] = dec
		}
		// What the command recorded must read back as itself, or a load
		// would fold other events than the command decided.
		for i, v := range recorded {
			dec, err := s.through(v, "recorded", i+1)
			if err != nil {
				problems = append(problems, err.Error())
			} else if lost := lostInTransit(v, dec); lost != "" {
				problems = append(problems, fmt.Sprintf("recorded event %d (%T) %s", i+1, v, lost))
			}
		}
	}
	// With a registry, expected and recorded are compared as the store
	// would tell them apart (valueDiff's wire mode): a value the command
	// carried over from the history has been through JSON, so a time in it
	// is in another zone than the one given, or lost its monotonic reading.
	// What JSON drops still counts, and the round-trip check above names it.
	wire := s.reg != nil
	if diff := aggFirstDiff(expected, recorded, wire); diff >= 0 {
		problems = append(problems, fmt.Sprintf("the command recorded other events than expected\nexpected %s\nrecorded %s%s",
			aggList(expected, diff), aggList(recorded, diff), aggExplain(expected, recorded, diff, wire)))
	}
	if len(problems) > 0 {
		s.t.Errorf("testkit: %s: %s", s.name(), strings.Join(problems, "\n"))
	}
	return a
}

// ThenError runs the scenario and checks that the command failed with an
// error matching target by the standard library's errors.Is: the error, or
// one it wraps, is target or says it is (an Is method; annals' own marked
// errors do). A different error with the same message does not match, nor
// does a mark made with cockroachdb/errors' Mark, which only that package's
// Is sees. A nil target accepts any error, but
// not a panic: a command that panics fails Then and ThenError alike, with
// the panic value and its stack. Events
// the command recorded before failing are not checked: a failed command is
// never saved.
func (s *AggregateScenario[A]) ThenError(target error) A {
	s.t.Helper()
	a, recorded, err, ok := s.run()
	if !ok {
		return a
	}
	want := "an error"
	if target != nil {
		want = fmt.Sprintf("an error matching %q", target)
	}
	switch {
	case err == nil:
		s.t.Errorf("testkit: %s: expected %s, but the command succeeded and recorded %s", s.name(), want, aggList(recorded, -1))
	case target != nil && !stderrors.Is(err, target):
		s.t.Errorf("testkit: %s: expected %s, got %q", s.name(), want, err)
	}
	return a
}

// run builds the aggregate from its history and runs the command; ok is
// false when the scenario itself is broken (reported).
func (s *AggregateScenario[A]) run() (a A, recorded []any, err error, ok bool) {
	s.t.Helper()
	s.checked.Store(true)
	if s.newAgg == nil || s.command == nil {
		s.t.Errorf("testkit: %s: Given needs a constructor and When a command", s.name())
		return a, nil, nil, false
	}
	for i, e := range s.history {
		if v := reflect.ValueOf(e); e == nil || v.Kind() == reflect.Pointer && v.IsNil() {
			s.t.Errorf("testkit: %s: history event %d is nil (%T)", s.name(), i+1, e)
			return a, nil, nil, false
		}
	}
	// Two mistakes the aggregate's own "not handled" would not explain.
	for i, e := range s.history {
		switch e.(type) {
		case StreamEvents, *StreamEvents:
			s.t.Errorf("testkit: %s: history event %d is a testkit.Stream group, which is for ReplayProjection and ReplaySaga: "+
				"give Given the aggregate's events themselves", s.name(), i+1)
			return a, nil, nil, false
		case eventstore.EventData, *eventstore.EventData:
			if s.reg == nil {
				s.t.Errorf("testkit: %s: history event %d is an eventstore.EventData (an event as stored): "+
					"give the scenario the registry that decodes it (WithRegistry), or give the event's Go value", s.name(), i+1)
				return a, nil, nil, false
			}
		}
	}
	// Pointer events are applied as the values they point to, as Record
	// records them and a load decodes them.
	history := aggDeref(s.history)
	if s.reg != nil {
		for i, v := range history {
			dec, err := s.through(v, "history", i+1)
			if err != nil {
				s.t.Errorf("testkit: %s: %v", s.name(), err)
				return a, nil, nil, false
			}
			if _, stored := v.(eventstore.EventData); !stored {
				if lost := lostInTransit(v, dec); lost != "" {
					s.t.Errorf("testkit: %s: history event %d (%T) %s", s.name(), i+1, v, lost)
					return a, nil, nil, false
				}
			}
			history[i] = dec
		}
	}
	var herr error
	panicked, _ := aggSafely("applying the given history", func() error {
		a, herr = aggregate.FromHistory(s.newAgg, s.id, history...)
		return nil
	})
	if panicked != "" {
		s.t.Errorf("testkit: %s: %s", s.name(), panicked)
		var zero A
		return zero, nil, nil, false
	}
	if herr != nil {
		s.t.Errorf("testkit: %s: the given history does not apply: %v", s.name(), herr)
		return a, nil, nil, false
	}
	panicked, err = aggSafely("the command", func() error { return s.command(a) })
	if panicked != "" {
		s.t.Errorf("testkit: %s: %s", s.name(), panicked)
		return a, nil, nil, false
	}
	return a, append([]any(nil), a.Uncommitted()...), err, true
}

// through encodes an event as an append would and decodes it as a read
// would; n is its place in what (history, expected, recorded).
func (s *AggregateScenario[A]) through(v any, what string, n int) (any, error) {
	e := eventstore.Event{StreamID: s.id, StreamVersion: int64(n)}
	if d, isData := v.(eventstore.EventData); isData {
		raw, err := json.Marshal(d.Data)
		if rm, isRaw := d.Data.(json.RawMessage); isRaw {
			raw, err = rm, nil
		}
		if err != nil {
			return nil, errors.Wrapf(err, "%s event %d (%s)", what, n, d.Type)
		}
		e.Type, e.Data, e.Metadata = d.Type, raw, d.Metadata
	} else {
		name, known := s.reg.NameOf(v)
		if !known {
			return nil, errors.Wrapf(eventstore.ErrUnknownEventType, "%s event %d: %T is not registered", what, n, v)
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, errors.Wrapf(err, "%s event %d (%T)", what, n, v)
		}
		e.Type, e.Data = name, raw
		e.Metadata.Extra = map[string]any{eventstore.SchemaVersionKey: s.reg.SchemaVersion(name)}
	}
	dec, err := s.reg.Decode(e)
	if err != nil {
		return nil, errors.Wrapf(err, "%s event %d", what, n)
	}
	return dec, nil
}

// lostInTransit says what of event v a round trip through JSON lost (dec is
// what it read back as), or "" when nothing was, by valueDiff's wire mode: a
// value that encodes itself (time.Time) counts as the same when its
// encoding is, and a nil and an empty slice or map in an omitempty field
// as the same.
func lostInTransit(v, dec any) string {
	path, was, got, differ := valueDiff(reflect.ValueOf(v), reflect.ValueOf(dec), true)
	if !differ {
		return ""
	}
	where := "the event"
	if path != "" {
		where = "field " + strings.TrimPrefix(path, ".")
	}
	return fmt.Sprintf("does not survive its round trip through JSON (as the store would write and read it): "+
		"%s was %s, reads back as %s%s",
		where, renderLeaf(was, got), renderLeaf(got, was), transitHint(was, got))
}

// transitHint says why a value read back from JSON as got when it was was:
// an any that held another type than JSON decodes into one, or a field
// encoding/json leaves out; "" when neither fits.
func transitHint(was, got reflect.Value) string {
	switch {
	case was.IsValid() && got.IsValid() && (was.Type() != got.Type() || was.Kind() == reflect.Interface):
		return " (in an any — a field, a map[string]any value, an []any element — encoding/json reads back " +
			"float64 for a number, map[string]any for an object, []any for an array, and string, bool or nil: " +
			"hold only those there)"
	case got.IsValid() && got.IsZero():
		return " (encoding/json leaves out unexported fields and fields tagged json:\"-\")"
	}
	return ""
}

func (s *AggregateScenario[A]) name() string {
	return fmt.Sprintf("aggregate %s %q", reflect.TypeFor[A](), s.id)
}

// aggFirstDiff returns the index of the first difference, or -1: by
// reflect.DeepEqual, or with wire by what the store can tell apart
// (valueDiff).
func aggFirstDiff(want, got []any, wire bool) int {
	for i := range max(len(want), len(got)) {
		if i >= len(want) || i >= len(got) {
			return i
		}
		if wire {
			if _, _, _, differ := valueDiff(reflect.ValueOf(want[i]), reflect.ValueOf(got[i]), true); differ {
				return i
			}
		} else if !reflect.DeepEqual(want[i], got[i]) {
			return i
		}
	}
	return -1
}

// aggList renders events one a line, marking the one at mark.
func aggList(events []any, mark int) string {
	if len(events) == 0 {
		return "no events"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d event(s):", len(events))
	for i, e := range events {
		prefix := "   "
		if i == mark {
			prefix = "-> "
		}
		fmt.Fprintf(&b, "\n  %s%d. %T %s", prefix, i+1, e, render(e))
	}
	return b.String()
}

// aggExplain names the first field where the events at i differ (compared
// as aggFirstDiff compared them), when both lists have one there of the
// same type: "\nevent 2 differs at Tags: expected [], recorded nil". It is
// "" otherwise (the listing says it).
func aggExplain(want, got []any, i int, wire bool) string {
	if i >= len(want) || i >= len(got) {
		return ""
	}
	path, w, g, differ := valueDiff(reflect.ValueOf(want[i]), reflect.ValueOf(got[i]), wire)
	if !differ || path == "" {
		return ""
	}
	return fmt.Sprintf("\nevent %d differs at %s: expected %s, recorded %s", i+1, strings.TrimPrefix(path, "."), renderLeaf(w, g), renderLeaf(g, w))
}

func aggDeref(events []any) []any {
	out := make([]any, len(events))
	for i, e := range events {
		if v := reflect.ValueOf(e); v.Kind() == reflect.Pointer && !v.IsNil() {
			e = v.Elem().Interface()
		}
		out[i] = e
	}
	return out
}

// aggSafely runs fn (what: "the command") and recovers a panic: panicked
// then describes it, with the stack. A panic is a bug, never the error a
// scenario expects.
func aggSafely(what string, fn func() error) (panicked string, err error) {
	defer func() {
		if r := recover(); r != nil {
			panicked = fmt.Sprintf("%s panicked: %v\n%s", what, r, debug.Stack())
		}
	}()
	return "", fn()
}
