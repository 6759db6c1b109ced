package saga_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

// A Register that is rejected changes nothing, also with a Scheduler: the
// scheduler's dispatcher is not left added to the runner (where Run would
// fire its timers, and the name "annals.scheduler" would be taken).
func TestRejectedRegisterAddsNoScheduler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sched, err := scheduler.New(b.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	unregistered := saga.New[counterState]("typed", b.reg)
	saga.On(unregistered, func(e eventstore.Envelope[struct{ X int }]) string { return "x" },
		func(context.Context, *saga.Instance[counterState], eventstore.Envelope[struct{ X int }]) error {
			return nil
		})
	rejected := []func(r *projection.Runner) error{
		func(r *projection.Runner) error { // a bad type glob
			return saga.Register(r, counterSaga(b.reg, time.Minute), &saga.Config{Store: b.store, Scheduler: sched,
				Options: &projection.Options{Types: []string{"test..added"}}})
		},
		func(r *projection.Runner) error { // a handler of an unregistered type
			return saga.Register(r, unregistered, &saga.Config{Store: b.store, Scheduler: sched})
		},
		func(r *projection.Runner) error { // a negative option
			return saga.Register(r, counterSaga(b.reg, time.Minute), &saga.Config{Store: b.store, Scheduler: sched,
				Options: &projection.Options{BatchSize: -1}})
		},
	}
	for i, reject := range rejected {
		r := b.runner(t)
		if err := reject(r); err == nil {
			t.Fatalf("case %d: Register accepted", i)
		}
		// The name is free: another scheduler can be added under it.
		other, err := scheduler.New(b.store, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.AddService("annals.scheduler", other); err != nil {
			t.Errorf("case %d: after the rejected Register, AddService(annals.scheduler) fails: %v", i, err)
		}
		// And Run has nothing to run.
		r = b.runner(t)
		if err := reject(r); err == nil {
			t.Fatalf("case %d: Register accepted", i)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err = r.Run(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "nothing registered") {
			t.Errorf("case %d: after the rejected Register, Run returned %v; want nothing registered", i, err)
		}
	}
	// A runner with another scheduler under the name rejects the saga,
	// registering nothing: the same saga registers once that is resolved.
	r := b.runner(t)
	other, err := scheduler.New(b.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.AddService("annals.scheduler", other); err != nil {
		t.Fatal(err)
	}
	s := counterSaga(b.reg, time.Minute)
	if err := saga.Register(r, s, &saga.Config{Store: b.store, Scheduler: sched}); err == nil ||
		!strings.Contains(err.Error(), "different service") {
		t.Fatalf("Register beside another scheduler: %v; want it refused", err)
	}
	if err := saga.Register(r, s, &saga.Config{Store: b.store, Scheduler: other}); err != nil {
		t.Fatalf("Register with the runner's scheduler after a refusal: %v (the first left the saga registered?)", err)
	}
}
