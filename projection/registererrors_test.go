package projection_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/projection"
)

// A negative option is refused naming the option and its value (it said
// `projection: "hits": negative option`, naming neither), for Register,
// RegisterProcessor, Rebuild and RebuildBlueGreen alike.
func TestNegativeOptionsAreNamed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := projection.NewRunner(b.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error, want string) {
		t.Helper()
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v; want %q", what, err, want)
		}
	}
	for _, c := range []struct {
		o    projection.Options
		want string
	}{
		{projection.Options{Partitions: -1}, `projection: "hits": Options.Partitions is -1: must be 0 or more`},
		{projection.Options{BatchSize: -2}, `projection: "hits": Options.BatchSize is -2: must be 0 or more`},
		{projection.Options{CheckpointEvery: -3}, `projection: "hits": Options.CheckpointEvery is -3: must be 0 or more`},
		{projection.Options{CheckpointInterval: -time.Second}, `projection: "hits": Options.CheckpointInterval is -1s: must be 0 or more`},
		{projection.Options{HandlerTimeout: -time.Millisecond}, `projection: "hits": Options.HandlerTimeout is -1ms: must be 0 or more`},
	} {
		check("Register", r.Register(namedObserver{"hits"}, &c.o), c.want)
	}
	var n int
	newProc := func() catchup.Processor { return countingProcessor{events: &n} }
	check("RegisterProcessor", r.RegisterProcessor("p", newProc, &projection.Options{Partitions: -1}),
		`projection: "p": Options.Partitions is -1: must be 0 or more`)
	check("RegisterProcessor", r.RegisterProcessor("p", newProc, &projection.Options{BatchSize: -1}),
		`projection: "p": Options.BatchSize is -1: must be 0 or more`)
	check("Rebuild", r.Rebuild(t.Context(), "hits", &projection.RebuildOptions{BatchSize: -1}),
		`projection: rebuild "hits": RebuildOptions.BatchSize is -1: must be 0 or more`)
	check("Rebuild", r.Rebuild(t.Context(), "hits", &projection.RebuildOptions{LockTimeout: -time.Second}),
		`projection: rebuild "hits": RebuildOptions.LockTimeout is -1s: must be 0 or more`)
	_, err = r.RebuildBlueGreen(t.Context(), "hits", &projection.RebuildOptions{BatchSize: -5})
	check("RebuildBlueGreen", err, `projection: rebuild "hits": RebuildOptions.BatchSize is -5: must be 0 or more`)
	_, err = r.RebuildBlueGreen(t.Context(), "hits", &projection.RebuildOptions{LockTimeout: -time.Minute})
	check("RebuildBlueGreen", err, `projection: rebuild "hits": RebuildOptions.LockTimeout is -1m0s: must be 0 or more`)
}

// A name registered twice is refused naming the kind of each registration
// (it said `projection: "w" is registered twice` whatever they were).
func TestRegisteredTwiceNamesTheKinds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := projection.NewRunner(b.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	newProc := func() catchup.Processor { return countingProcessor{events: &n} }
	if err := r.Register(namedObserver{"w"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(balances(b.reg), nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{r.Register(namedObserver{"w"}, nil), `projection: observer "w" is registered twice`},
		{r.Register(namedObserver{"balances"}, nil), `projection: observer "balances" is registered twice (first as a projection)`},
		{r.Register(balances(b.reg), nil), `projection: projection "balances" is registered twice`},
		{r.RegisterProcessor("w", newProc, nil), `projection: processor "w" is registered twice (first as an observer)`},
	} {
		if !errors.Is(c.err, projection.ErrRegisteredTwice) || c.err.Error() != c.want {
			t.Errorf("%v; want ErrRegisteredTwice reading %q", c.err, c.want)
		}
	}
	if err := r.RegisterProcessor("p", newProc, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterProcessor("p", newProc, nil); err == nil || !strings.Contains(err.Error(), `processor "p" is registered twice`) {
		t.Errorf("a second processor p: %v", err)
	}
}
