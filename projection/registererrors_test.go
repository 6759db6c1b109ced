package projection_test

import (
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
