package projection_test

import (
	"context"
	"github.com/annals-dev/annals/annalstest"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

type namedObserver struct{ name string }

func (o namedObserver) Name() string                                   { return o.name }
func (o namedObserver) Handle(context.Context, eventstore.Event) error { return nil }

// A subscriber named like a blue/green generation's (<name>#g<N>) is
// refused: it would share the generation's checkpoints, lock and dead
// letters, and each would move the other's checkpoint past events it never
// handled. Register accepted it.
func TestRegisterRefusesGenerationNames(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := projection.NewRunner(b.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := balances(b.reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE balances (account text PRIMARY KEY, amount bigint NOT NULL, events int NOT NULL)`))
	if err := r.Register(p, &projection.Options{BlueGreen: &projection.BlueGreen{Version: 1}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"balances#g1", "balances#g12", "other#g0"} {
		err := r.Register(namedObserver{name}, nil)
		if err == nil || !strings.Contains(err.Error(), "reserved for the subscribers of blue/green generations") {
			t.Errorf("Register(observer %q) = %v, want it refused as a generation's name", name, err)
		}
		err = r.RegisterProcessor(name, func() catchup.Processor { return nil }, nil)
		if err == nil || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("RegisterProcessor(%q) = %v, want it refused as a generation's name", name, err)
		}
	}
	// Names that merely contain '#' are not a generation's.
	for _, name := range []string{"balances#g", "balances#gx", "balances#g1x", "a#b"} {
		if err := r.Register(namedObserver{name}, nil); err != nil {
			t.Errorf("Register(observer %q) = %v", name, err)
		}
	}
}

// Options.Types that select none of the types a typed projection handles
// leave it nothing to handle: Register refuses them, naming the handled
// types (it accepted them, and the projection then handled nothing). Types
// that leave some out are allowed, with a warning.
func TestRegisterTypesSelectingNoHandledType(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs annalstest.LogBuffer
	r, err := projection.NewRunner(b.db.Pool, &projection.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	deposits := func(name string) *projection.Typed {
		p := projection.New(name, b.reg)
		projection.On(p, func(context.Context, pgx.Tx, eventstore.Envelope[Deposited]) error { return nil })
		return p
	}
	err = r.Register(deposits("none"), &projection.Options{Types: []string{"account.withdrawn"}})
	if err == nil || !strings.Contains(err.Error(), "select none of the event types it handles (account.deposited)") {
		t.Fatalf("Register with Types selecting no handled type = %v", err)
	}
	o := projection.NewObserver("none.o", b.reg)
	projection.Observe(o, func(context.Context, eventstore.Envelope[Withdrawn]) error { return nil })
	if err := r.Register(o, &projection.Options{Types: []string{"other.*"}}); err == nil {
		t.Fatal("Register of an observer with Types selecting no handled type succeeded")
	}
	// A glob that selects the handled type, and every type: accepted, silently.
	for i, types := range [][]string{{"account.*"}, {"*"}, {"account.deposited", "x"}} {
		if err := r.Register(deposits("ok"+string(rune('a'+i))), &projection.Options{Types: types}); err != nil {
			t.Fatalf("Register with Types %q: %v", types, err)
		}
	}
	if strings.Contains(logs.String(), "leave out") {
		t.Fatalf("a warning for Types that select every handled type:\n%s", logs.String())
	}
	// Some handled types left out: accepted, with a warning naming them.
	if err := r.Register(balances(b.reg), &projection.Options{Types: []string{"account.deposited"}}); err != nil {
		t.Fatal(err)
	}
	if s := logs.String(); !strings.Contains(s, "leave out") || !strings.Contains(s, "not_selected=account.withdrawn") {
		t.Fatalf("no warning naming the handled type Types leave out:\n%s", s)
	}
}
