package testkit_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // Europe/Berlin, wherever the tests run

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/testkit"
)

// The aggregate under test: a wallet.

type gwOpened struct {
	Owner string `json:"owner"`
}

type gwDeposited struct {
	Amount int `json:"amount"`
}

type gwWithdrawn struct {
	Amount int `json:"amount"`
}

type gwClosed struct{} // Wallet does not handle it

// gwPaid loses its amount in JSON: the field is unexported.
type gwPaid struct {
	Invoice string `json:"invoice"`
	amount  int
}

// gwNoted loses its Secret in JSON: the field is tagged "-".
type gwNoted struct {
	Text   string `json:"text"`
	Secret string `json:"-"`
}

// gwMeta reads back with other types: a JSON number is a float64 in an any.
type gwMeta struct {
	Meta map[string]any `json:"meta"`
}

// gwValued reads back with another type: its V holds an int.
type gwValued struct {
	V any `json:"v"`
}

// gwLabelled has what %+v prints alike when it differs: a nil and an empty
// slice, and pointers (as addresses).
type gwLabelled struct {
	Tags []string `json:"tags"`
	Ref  *int     `json:"ref"`
}

// gwTagged survives JSON though it does not read back identical: an empty
// Tags is omitted (nil after a read), At loses its monotonic reading and
// its zone (an offset after a read).
type gwTagged struct {
	Tags []string  `json:"tags,omitempty"`
	At   time.Time `json:"at"`
}

// gwStarted and gwStopped carry a time from the history into a new event:
// the wallet keeps At and a stop copies it.
type gwStarted struct {
	At time.Time `json:"at"`
}

type gwStopped struct {
	StartedAt time.Time `json:"started_at"`
}

var errNoFunds = errors.New("insufficient funds")

type wallet struct {
	aggregate.Base
	Owner   string
	Balance int
	Started time.Time
}

func newWallet() *wallet { return &wallet{} }

func (w *wallet) Apply(event any) error {
	switch e := event.(type) {
	case gwOpened:
		w.Owner = e.Owner
	case gwDeposited:
		w.Balance += e.Amount
	case gwWithdrawn:
		w.Balance -= e.Amount
	case gwPaid:
		w.Balance -= e.amount
	case gwStarted:
		w.Started = e.At
	case gwNoted, gwTagged, gwMeta, gwValued, gwLabelled, gwStopped:
	default:
		return aggregate.ErrUnhandledEvent
	}
	return nil
}

func (w *wallet) Withdraw(n int) error {
	if n > w.Balance {
		return errors.Wrapf(errNoFunds, "withdraw %d from %d", n, w.Balance)
	}
	return aggregate.Record(w, gwWithdrawn{Amount: n})
}

// panicky panics in Apply.
type panicky struct{ aggregate.Base }

func (*panicky) Apply(any) error { panic("apply boom") }

// gwTB records what the kit reports instead of failing the real test.
type gwTB struct {
	testing.TB // nil: the kit must only call Helper, Errorf and Cleanup
	errs       []string
	cleanups   []func()
}

func (f *gwTB) Helper() {}
func (f *gwTB) Errorf(format string, args ...any) {
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}
func (f *gwTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

// end runs the cleanups, as the end of a test would.
func (f *gwTB) end() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	f.cleanups = nil
}

// expectFailure checks that the kit reported exactly one failure holding
// every fragment.
func expectFailure(t *testing.T, f *gwTB, fragments ...string) {
	t.Helper()
	f.end()
	if len(f.errs) != 1 {
		t.Fatalf("the kit reported %d failures, want 1: %q", len(f.errs), f.errs)
	}
	for _, frag := range fragments {
		if !strings.Contains(f.errs[0], frag) {
			t.Errorf("the failure message lacks %q:\n%s", frag, f.errs[0])
		}
	}
}

func TestGivenWhenThen(t *testing.T) {
	t.Parallel()

	t.Run("Then", func(t *testing.T) {
		t.Parallel()
		w := testkit.Given(t, newWallet, gwOpened{Owner: "ann"}, gwDeposited{Amount: 100}).
			When(func(w *wallet) error { return w.Withdraw(30) }).
			Then(gwWithdrawn{Amount: 30})
		if w.Balance != 70 || w.Version() != 2 || w.ID() != "test" {
			t.Fatalf("aggregate after the command: %+v at %d", *w, w.Version())
		}
	})

	// Pointer events, in the history as in the expected events, are the
	// values they point to, with or without a registry.
	t.Run("PointerEvents", func(t *testing.T) {
		t.Parallel()
		reg := eventstore.NewRegistry()
		eventstore.MustRegister[gwOpened](reg, "wallet.opened")
		eventstore.MustRegister[gwDeposited](reg, "wallet.deposited")
		eventstore.MustRegister[gwWithdrawn](reg, "wallet.withdrawn")
		for _, reg := range []*eventstore.Registry{nil, reg} {
			s := testkit.Given(t, newWallet, &gwOpened{Owner: "ann"}, &gwDeposited{Amount: 100})
			if reg != nil {
				s = s.WithRegistry(reg)
			}
			w := s.When(func(w *wallet) error { return w.Withdraw(30) }).Then(&gwWithdrawn{Amount: 30})
			if w == nil || w.Owner != "ann" || w.Balance != 70 {
				t.Errorf("registry %v: aggregate after the command: %+v", reg != nil, w)
			}
		}
	})

	t.Run("ThenNothing", func(t *testing.T) {
		t.Parallel()
		testkit.Given(t, newWallet).When(func(*wallet) error { return nil }).Then()
	})

	t.Run("ThenError", func(t *testing.T) {
		t.Parallel()
		testkit.Given(t, newWallet, gwOpened{Owner: "ann"}).WithID("w-1").
			When(func(w *wallet) error { return w.Withdraw(1) }).
			ThenError(errNoFunds)
		// annals' own errors match their sentinels: Record of an event Apply
		// does not handle.
		testkit.Given(t, newWallet).
			When(func(w *wallet) error { return aggregate.Record(w, gwClosed{}) }).
			ThenError(aggregate.ErrUnhandledEvent)
	})

	t.Run("WithRegistry", func(t *testing.T) {
		t.Parallel()
		reg := eventstore.NewRegistry()
		eventstore.MustRegister[gwOpened](reg, "wallet.opened")
		eventstore.MustRegister[gwDeposited](reg, "wallet.deposited")
		eventstore.MustRegister[gwWithdrawn](reg, "wallet.withdrawn")
		// wallet.deposited v1 stored cents as a string.
		reg.MustRegisterUpcaster("wallet.deposited", 1, func(d json.RawMessage) (json.RawMessage, error) {
			var v1 struct {
				Cents string `json:"cents"`
			}
			if err := json.Unmarshal(d, &v1); err != nil {
				return nil, err
			}
			var n int
			if _, err := fmt.Sscan(v1.Cents, &n); err != nil {
				return nil, err
			}
			return json.Marshal(gwDeposited{Amount: n})
		})
		w := testkit.Given(t, newWallet,
			gwOpened{Owner: "ann"},
			eventstore.EventData{Type: "wallet.deposited", Data: json.RawMessage(`{"cents":"50"}`)}, // as stored, v1
			gwDeposited{Amount: 25}, // current version
		).WithRegistry(reg).
			When(func(w *wallet) error { return w.Withdraw(75) }).
			Then(gwWithdrawn{Amount: 75})
		if w.Balance != 0 {
			t.Fatalf("balance %d, want 0", w.Balance)
		}
	})
}

// With a registry, the recorded events are compared with the expected ones
// as recorded, and each must also read back as itself from JSON: a field
// that JSON drops fails the test, naming the event and the field, even when
// the expected event agrees with the recorded one.
func TestGivenWhenThenWithRegistryChecksRoundTrips(t *testing.T) {
	t.Parallel()
	newReg := func() *eventstore.Registry {
		reg := eventstore.NewRegistry()
		eventstore.MustRegister[gwOpened](reg, "wallet.opened")
		eventstore.MustRegister[gwPaid](reg, "wallet.paid")
		eventstore.MustRegister[gwNoted](reg, "wallet.noted")
		eventstore.MustRegister[gwTagged](reg, "wallet.tagged")
		eventstore.MustRegister[gwMeta](reg, "wallet.meta")
		eventstore.MustRegister[gwValued](reg, "wallet.valued")
		eventstore.MustRegister[gwLabelled](reg, "wallet.labelled")
		eventstore.MustRegister[gwStarted](reg, "wallet.started")
		eventstore.MustRegister[gwStopped](reg, "wallet.stopped")
		return reg
	}
	pay := func(w *wallet) error { return aggregate.Record(w, gwPaid{Invoice: "A", amount: 30}) }

	// The false green this guards against: a round trip of both sides made
	// amount 0 on both, and the scenario passed.
	t.Run("ExpectedComparedAsRecorded", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet, gwOpened{Owner: "ann"}).WithRegistry(newReg()).
			When(pay).
			Then(gwPaid{Invoice: "A", amount: 20})
		expectFailure(t, f,
			"recorded event 1 (testkit_test.gwPaid) does not survive its round trip through JSON",
			"field amount was 30, reads back as 0",
			"recorded other events than expected",
			`-> 1. testkit_test.gwPaid {Invoice:"A" amount:20}`,
			`-> 1. testkit_test.gwPaid {Invoice:"A" amount:30}`,
			"event 1 differs at amount: expected 20, recorded 30")
	})

	t.Run("UnexportedFieldLost", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet).WithRegistry(newReg()).
			When(pay).
			Then(gwPaid{Invoice: "A", amount: 30})
		expectFailure(t, f, "recorded event 1 (testkit_test.gwPaid) does not survive", "field amount was 30, reads back as 0",
			`(encoding/json leaves out unexported fields and fields tagged json:"-")`)
		if strings.Contains(f.errs[0], "other events than expected") {
			t.Errorf("the expected event was the recorded one, yet:\n%s", f.errs[0])
		}
	})

	t.Run("IgnoredFieldLost", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet).WithRegistry(newReg()).
			When(func(w *wallet) error { return aggregate.Record(w, gwNoted{Text: "hi", Secret: "s3"}) }).
			Then(gwNoted{Text: "hi", Secret: "s3"})
		expectFailure(t, f, "recorded event 1 (testkit_test.gwNoted) does not survive", `field Secret was "s3", reads back as ""`)
	})

	t.Run("HistoryFieldLost", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet, gwOpened{Owner: "ann"}, gwPaid{Invoice: "B", amount: 5}).WithRegistry(newReg()).
			When(func(*wallet) error { t.Error("the command ran on a history that lost a field"); return nil }).
			Then()
		expectFailure(t, f, "history event 2 (testkit_test.gwPaid) does not survive", "field amount was 5, reads back as 0")
	})

	t.Run("TypeChanged", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		meta := gwMeta{Meta: map[string]any{"a": "x", "n": 3}}
		testkit.Given(f, newWallet).WithRegistry(newReg()).
			When(func(w *wallet) error { return aggregate.Record(w, meta) }).
			Then(meta)
		expectFailure(t, f, "recorded event 1 (testkit_test.gwMeta) does not survive", `field Meta["n"] was int 3, reads back as float64 3`,
			"encoding/json reads back float64 for a number")
		if strings.Contains(f.errs[0], "unexported") {
			t.Errorf("a type change is blamed on a dropped field:\n%s", f.errs[0])
		}
	})

	// An any-typed field must hold what JSON decodes to: an int is not.
	t.Run("AnyFieldHoldsInt", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet).WithRegistry(newReg()).
			When(func(w *wallet) error { return aggregate.Record(w, gwValued{V: 7}) }).
			Then(gwValued{V: 7})
		expectFailure(t, f, "recorded event 1 (testkit_test.gwValued) does not survive", "field V was int 7, reads back as float64 7",
			"encoding/json reads back float64 for a number, map[string]any for an object, []any for an array")
		if strings.Contains(f.errs[0], "unexported") {
			t.Errorf("a type change is blamed on a dropped field:\n%s", f.errs[0])
		}
	})

	// A value the aggregate carries from its history into a new event has
	// been through JSON, as after a load: a time comes back in a zone
	// without a name, or in UTC, and without its monotonic reading. It is
	// still the time given, and the scenario passes.
	t.Run("TimeFromHistory", func(t *testing.T) {
		t.Parallel()
		berlin, err := time.LoadLocation("Europe/Berlin")
		if err != nil {
			t.Fatal(err)
		}
		for name, at := range map[string]time.Time{
			"NamedZone": time.Date(2026, 3, 1, 9, 30, 0, 0, berlin),
			"Local":     time.Date(2026, 3, 1, 9, 30, 0, 0, time.Local),
			"Now":       time.Now(),
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f := &gwTB{}
				testkit.Given(f, newWallet, gwStarted{At: at}).WithRegistry(newReg()).
					When(func(w *wallet) error { return aggregate.Record(w, gwStopped{StartedAt: w.Started}) }).
					Then(gwStopped{StartedAt: at})
				f.end()
				if len(f.errs) != 0 {
					t.Errorf("the scenario failed:\n%s", strings.Join(f.errs, "\n"))
				}
			})
		}
	})

	// Another time is still another time, and its field is named.
	t.Run("OtherTimeFromHistory", func(t *testing.T) {
		t.Parallel()
		at := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
		f := &gwTB{}
		testkit.Given(f, newWallet, gwStarted{At: at}).WithRegistry(newReg()).
			When(func(w *wallet) error { return aggregate.Record(w, gwStopped{StartedAt: w.Started}) }).
			Then(gwStopped{StartedAt: at.Add(time.Second)})
		expectFailure(t, f, "recorded other events than expected",
			"event 1 differs at StartedAt: expected 2026-03-01 09:30:01 +0000 UTC, recorded 2026-03-01 09:30:00 +0000 UTC")
		if strings.Contains(f.errs[0], "does not survive") {
			t.Errorf("the recorded event survives JSON, yet:\n%s", f.errs[0])
		}
	})

	// A nil and an empty slice are stored alike (and so compared alike)
	// only where omitempty leaves both out: without it one is null, the
	// other [].
	t.Run("NilIsNotEmptyWithoutOmitempty", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet).WithRegistry(newReg()).
			When(func(w *wallet) error { return aggregate.Record(w, gwLabelled{Tags: []string{}}) }).
			Then(gwLabelled{})
		expectFailure(t, f, "recorded other events than expected", "event 1 differs at Tags: expected nil, recorded []")
	})

	// Without a registry nothing goes through JSON: the amounts differ.
	t.Run("WithoutRegistry", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet).When(pay).Then(gwPaid{Invoice: "A", amount: 20})
		expectFailure(t, f, "recorded other events than expected")
	})

	// What JSON changes without losing it passes: an empty slice omitted, a
	// time in another zone with a monotonic reading.
	t.Run("EquivalentValuesSurvive", func(t *testing.T) {
		t.Parallel()
		at := time.Now().In(time.FixedZone("X", 5400))
		testkit.Given(t, newWallet, gwTagged{Tags: []string{}, At: at}).WithRegistry(newReg()).
			When(func(w *wallet) error { return aggregate.Record(w, gwTagged{Tags: []string{}, At: at}) }).
			Then(gwTagged{Tags: []string{}, At: at})
	})
}

func TestGivenWhenThenReportsFailures(t *testing.T) {
	t.Parallel()
	opened := gwOpened{Owner: "ann"}

	// An event as stored without the registry that decodes it, and a
	// testkit.Stream group (ReplayProjection's), said only "event type not
	// handled by the aggregate".
	t.Run("HistoryMistakes", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet, eventstore.EventData{Type: "gw.opened", Data: json.RawMessage(`{"owner":"ann"}`)}).
			When(func(w *wallet) error { return w.Withdraw(30) }).
			Then()
		expectFailure(t, f, "history event 1 is an eventstore.EventData", "WithRegistry")
		f = &gwTB{}
		testkit.Given(f, newWallet, testkit.Stream("w", opened)).
			When(func(w *wallet) error { return w.Withdraw(30) }).
			Then()
		expectFailure(t, f, "history event 1 is a testkit.Stream group", "ReplayProjection")
	})

	t.Run("OtherEvents", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet, opened, gwDeposited{Amount: 100}).
			When(func(w *wallet) error { return w.Withdraw(30) }).
			Then(gwWithdrawn{Amount: 20})
		expectFailure(t, f, "recorded other events than expected",
			"expected 1 event(s):\n  -> 1. testkit_test.gwWithdrawn {Amount:20}",
			"recorded 1 event(s):\n  -> 1. testkit_test.gwWithdrawn {Amount:30}")
	})

	// Events that differ print differently: a nil slice is not an empty
	// one, a pointer shows what it points to, and the first field that
	// differs is named.
	t.Run("ListingShowsTheDifference", func(t *testing.T) {
		t.Parallel()
		five, six := 5, 6
		label := func(w *wallet) error { return aggregate.Record(w, gwLabelled{Tags: []string{}, Ref: &six}) }
		for _, tc := range []struct {
			expected  gwLabelled
			fragments []string
		}{
			{gwLabelled{Ref: &six}, []string{
				"expected 1 event(s):\n  -> 1. testkit_test.gwLabelled {Tags:nil Ref:&6}",
				"recorded 1 event(s):\n  -> 1. testkit_test.gwLabelled {Tags:[] Ref:&6}",
				"event 1 differs at Tags: expected nil, recorded []"}},
			{gwLabelled{Tags: []string{}, Ref: &five}, []string{
				"-> 1. testkit_test.gwLabelled {Tags:[] Ref:&5}",
				"event 1 differs at Ref: expected 5, recorded 6"}},
			{gwLabelled{Tags: []string{}}, []string{
				"-> 1. testkit_test.gwLabelled {Tags:[] Ref:nil}",
				"event 1 differs at Ref: expected nil, recorded &6"}},
			{gwLabelled{Tags: []string{"a b"}, Ref: &six}, []string{
				`-> 1. testkit_test.gwLabelled {Tags:["a b"] Ref:&6}`,
				`event 1 differs at Tags: expected ["a b"], recorded []`}},
		} {
			f := &gwTB{}
			testkit.Given(f, newWallet).When(label).Then(tc.expected)
			expectFailure(t, f, tc.fragments...)
			if strings.Contains(f.errs[0], "0xc") {
				t.Errorf("the failure prints an address:\n%s", f.errs[0])
			}
		}
	})

	// Times that differ only in their location or monotonic reading print
	// differently too (Local and UTC print alike where Local is UTC), and
	// the field is named, not its insides.
	t.Run("TimesPrintWithTheirLocation", func(t *testing.T) {
		t.Parallel()
		berlin, err := time.LoadLocation("Europe/Berlin")
		if err != nil {
			t.Fatal(err)
		}
		at := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
		now := time.Now()
		for name, tc := range map[string]struct{ recorded, expected time.Time }{
			"LocalAndUTC":         {at.In(time.Local), at},
			"FixedUTCAndUTC":      {at.In(time.FixedZone("UTC", 0)), at},
			"NamedAndFixed":       {at.In(berlin), at.In(time.FixedZone("CET", 3600))},
			"MonotonicAndWithout": {now, now.Round(0)},
		} {
			f := &gwTB{}
			testkit.Given(f, newWallet).
				When(func(w *wallet) error { return aggregate.Record(w, gwTagged{At: tc.recorded}) }).
				Then(gwTagged{At: tc.expected})
			expectFailure(t, f, "recorded other events than expected", "event 1 differs at At: expected ")
			var marked []string
			for _, line := range strings.Split(f.errs[0], "\n") {
				if strings.Contains(line, "-> 1.") {
					marked = append(marked, line)
				}
			}
			if len(marked) != 2 || marked[0] == marked[1] {
				t.Errorf("%s: the two times print alike:\n%s", name, f.errs[0])
			}
			_, explained, _ := strings.Cut(f.errs[0], "event 1 differs at At: expected ")
			if want, got, _ := strings.Cut(explained, ", recorded "); want == got {
				t.Errorf("%s: the differing field prints alike:\n%s", name, f.errs[0])
			}
		}
		// Where it tells something, the location is printed.
		f := &gwTB{}
		testkit.Given(f, newWallet).
			When(func(w *wallet) error { return aggregate.Record(w, gwTagged{At: at.In(berlin)}) }).
			Then(gwTagged{At: at.In(time.Local)})
		expectFailure(t, f, "2026-03-01 10:30:00 +0100 CET (Europe/Berlin)", " (Local)")
	})

	t.Run("MissingEvent", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet, opened, gwDeposited{Amount: 100}).
			When(func(w *wallet) error { return w.Withdraw(30) }).
			Then(gwWithdrawn{Amount: 30}, gwWithdrawn{Amount: 1})
		expectFailure(t, f, "expected 2 event(s)", "     1. testkit_test.gwWithdrawn {Amount:30}", "  -> 2. testkit_test.gwWithdrawn {Amount:1}", "recorded 1 event(s)")
	})

	t.Run("UnexpectedEvent", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet, opened, gwDeposited{Amount: 100}).
			When(func(w *wallet) error { return w.Withdraw(30) }).
			Then()
		expectFailure(t, f, "expected no events", "recorded 1 event(s)")
	})

	t.Run("CommandFailed", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet, opened).
			When(func(w *wallet) error { return w.Withdraw(30) }).
			Then(gwWithdrawn{Amount: 30})
		expectFailure(t, f, "the command failed", "insufficient funds", "expected 1 event(s)")
	})

	t.Run("ExpectedErrorButSucceeded", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet, opened, gwDeposited{Amount: 100}).
			When(func(w *wallet) error { return w.Withdraw(30) }).
			ThenError(errNoFunds)
		expectFailure(t, f, `expected an error matching "insufficient funds"`, "the command succeeded", "gwWithdrawn {Amount:30}")
	})

	t.Run("OtherError", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet, opened).
			When(func(*wallet) error { return errors.New("disk on fire") }).
			ThenError(errNoFunds)
		expectFailure(t, f, "disk on fire")
	})

	// Matching is by identity, not by message: another sentinel with the
	// same text is another error.
	t.Run("SameMessageOtherSentinel", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		lookalike := errors.New("insufficient funds")
		testkit.Given(f, newWallet, opened).
			When(func(w *wallet) error { return w.Withdraw(30) }).
			ThenError(lookalike)
		expectFailure(t, f, `expected an error matching "insufficient funds"`, "withdraw 30 from 0")
	})

	t.Run("HistoryNotApplied", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet, opened, gwClosed{}).
			When(func(*wallet) error { t.Error("the command ran on a broken history"); return nil }).
			Then()
		expectFailure(t, f, "history does not apply", "testkit_test.gwClosed", "version 2")
	})

	t.Run("Panic", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet).When(func(*wallet) error { panic("boom") }).Then()
		expectFailure(t, f, "panicked: boom", "goroutine ", "aggregate_test.go:")
	})

	// A panic is a bug, not the error a scenario expects: ThenError fails
	// on it whatever its target, "any error" (nil) included.
	t.Run("PanicIsNotAnError", func(t *testing.T) {
		t.Parallel()
		for _, target := range []error{nil, errNoFunds} {
			f := &gwTB{}
			testkit.Given(f, newWallet, opened).
				When(func(*wallet) error {
					var m map[string]int
					m["x"] = 1 // panics: assignment to entry in nil map
					return errNoFunds
				}).
				ThenError(target)
			expectFailure(t, f, "panicked: assignment to entry in nil map", "aggregate_test.go:")
		}
	})

	// A scenario without Then or ThenError checks nothing: it fails the
	// test when the test ends, not silently passes.
	t.Run("NeverChecked", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, newWallet, opened).
			When(func(w *wallet) error { return w.Withdraw(100) })
		if len(f.errs) != 0 {
			t.Fatalf("failures before the test ended: %q", f.errs)
		}
		expectFailure(t, f, "never checked", "Then or ThenError", "aggregate_test.go:")
	})

	// A nil history event is named, with or without a registry; a history
	// whose Apply panics fails the test like a panicking command.
	t.Run("NilHistoryEvent", func(t *testing.T) {
		t.Parallel()
		reg := eventstore.NewRegistry()
		eventstore.MustRegister[gwOpened](reg, "wallet.opened")
		for _, reg := range []*eventstore.Registry{nil, reg} {
			for _, nilEvent := range []any{nil, (*gwOpened)(nil)} {
				f := &gwTB{}
				s := testkit.Given(f, newWallet, opened, nilEvent)
				if reg != nil {
					s = s.WithRegistry(reg)
				}
				s.When(func(*wallet) error { t.Error("the command ran on a nil history event"); return nil }).Then()
				expectFailure(t, f, "history event 2 is nil")
			}
		}
	})

	t.Run("HistoryPanics", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		testkit.Given(f, func() *panicky { return &panicky{} }, opened).
			When(func(*panicky) error { t.Error("the command ran on a history that panicked"); return nil }).
			Then()
		expectFailure(t, f, "applying the given history panicked: apply boom", "aggregate_test.go:")
	})

	t.Run("UnregisteredEvent", func(t *testing.T) {
		t.Parallel()
		f := &gwTB{}
		reg := eventstore.NewRegistry()
		eventstore.MustRegister[gwOpened](reg, "wallet.opened")
		eventstore.MustRegister[gwDeposited](reg, "wallet.deposited")
		testkit.Given(f, newWallet, opened, gwDeposited{Amount: 100}).WithRegistry(reg).
			When(func(w *wallet) error { return w.Withdraw(30) }).
			Then(gwWithdrawn{Amount: 30})
		expectFailure(t, f, "recorded event 1", "gwWithdrawn is not registered")
	})
}
