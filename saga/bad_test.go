package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
)

type deadLetter struct {
	Stream   string
	Attempts int
	Error    string
}

func (b *bundle) deadLetters(t *testing.T, sub string) []deadLetter {
	t.Helper()
	rows, err := b.db.Pool.Query(t.Context(), `SELECT stream_id, attempts, error FROM annals.dead_letters
		 WHERE subscriber_id = $1 ORDER BY global_sequence`, sub)
	if err != nil {
		t.Fatal(err)
	}
	dls, err := pgx.CollectRows(rows, pgx.RowToStructByPos[deadLetter])
	if err != nil {
		t.Fatal(err)
	}
	return dls
}

// wantDeadLetter checks that sub has exactly one dead letter, of stream,
// after attempts attempts, whose error contains each of texts.
func (b *bundle) wantDeadLetter(t *testing.T, sub, stream string, attempts int, texts ...string) {
	t.Helper()
	dls := b.deadLetters(t, sub)
	if len(dls) != 1 || dls[0].Stream != stream || dls[0].Attempts != attempts {
		t.Fatalf("dead letters %+v; want one of stream %q after %d attempts", dls, stream, attempts)
	}
	for _, s := range texts {
		if !strings.Contains(dls[0].Error, s) {
			t.Errorf("the dead letter's error %q does not say %q", dls[0].Error, s)
		}
	}
}

// rawSaga is a Saga built from functions.
type rawSaga[S any] struct {
	name      string
	correlate func(e eventstore.Event) (string, bool)
	handle    func(ctx context.Context, inst *saga.Instance[S], e eventstore.Event) error
}

func (s *rawSaga[S]) Name() string                                { return s.name }
func (s *rawSaga[S]) Correlate(e eventstore.Event) (string, bool) { return s.correlate(e) }
func (s *rawSaga[S]) Handle(ctx context.Context, inst *saga.Instance[S], e eventstore.Event) error {
	return s.handle(ctx, inst, e)
}

// namedObserver is an observer that does nothing.
type namedObserver string

func (o namedObserver) Name() string                                   { return string(o) }
func (o namedObserver) Handle(context.Context, eventstore.Event) error { return nil }

func addedID(e eventstore.Event) (string, bool) {
	var a Added
	_ = json.Unmarshal(e.Data, &a)
	return a.ID, e.Type == "test.added"
}

func TestBadInput(t *testing.T) {
	t.Parallel()

	t.Run("RegisterRejects", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		unregistered := saga.New[counterState]("typed", b.reg)
		saga.On(unregistered, func(e eventstore.Envelope[struct{ X int }]) string { return "x" },
			func(context.Context, *saga.Instance[counterState], eventstore.Envelope[struct{ X int }]) error {
				return nil
			})
		ok := &saga.Config{Store: b.store}
		cases := []struct {
			name string
			do   func() error
			want string
		}{
			{"NilRunner", func() error { return saga.Register(nil, counterSaga(b.reg, 0), ok) }, "nil runner"},
			{"NilSaga", func() error { return saga.Register[counterState](r, nil, ok) }, "Register(<nil>(nil))"},
			{"NilTypedSaga", func() error { return saga.Register[counterState](r, (*saga.Typed[counterState])(nil), ok) }, "(nil)"},
			{"EmptyName", func() error { return saga.Register(r, saga.New[counterState]("", b.reg), ok) }, "empty name"},
			{"NilConfig", func() error { return saga.Register(r, counterSaga(b.reg, 0), nil) }, "Config.Store is required"},
			{"NilStore", func() error { return saga.Register(r, counterSaga(b.reg, 0), &saga.Config{}) }, "Config.Store is required"},
			{"Partitioned", func() error {
				return saga.Register(r, counterSaga(b.reg, 0), &saga.Config{Store: b.store, Options: &projection.Options{Partitions: 2}})
			}, "cannot be partitioned: one instance's events may come from several streams"},
			{"NegativeRetention", func() error {
				return saga.Register(r, counterSaga(b.reg, 0), &saga.Config{Store: b.store, Retention: -time.Hour})
			}, "negative Retention"},
			{"UnregisteredType", func() error { return saga.Register(r, unregistered, ok) }, "is not registered"},
			{"NoTypes", func() error { return saga.Register(r, saga.New[counterState]("none", b.reg), ok) }, "handles no event types"},
			{"BadTypeGlob", func() error {
				return saga.Register(r, counterSaga(b.reg, 0), &saga.Config{Store: b.store, Options: &projection.Options{Types: []string{"test..added"}}})
			}, "empty segment"},
		}
		for _, c := range cases {
			err := c.do()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: Register returned %v; want an error saying %q", c.name, err, c.want)
			}
		}
		// Nothing was registered.
		if err := r.RunUntilCaughtUp(t.Context()); err == nil || !strings.Contains(err.Error(), "nothing registered") {
			t.Fatalf("after the rejected registrations RunUntilCaughtUp says %v; want nothing registered", err)
		}
		register(t, r, counterSaga(b.reg, 0), ok)
		if err := r.Register(namedObserver("watcher"), nil); err != nil {
			t.Fatal(err)
		}
		// A name registered twice is refused naming the saga as a saga, and
		// the kind registered first (it said `saga "counter": projection:
		// projection "counter" is registered twice`: the runner took the
		// saga for a projection).
		watcher := &rawSaga[counterState]{name: "watcher", correlate: addedID,
			handle: func(context.Context, *saga.Instance[counterState], eventstore.Event) error { return nil }}
		for _, c := range []struct {
			err  error
			want string
		}{
			{saga.Register(r, counterSaga(b.reg, 0), ok), `projection: saga "counter" is registered twice`},
			{saga.Register[counterState](r, watcher, ok), `projection: saga "watcher" is registered twice (first as an observer)`},
			{r.Register(namedObserver("counter"), nil), `projection: observer "counter" is registered twice (first as a saga)`},
		} {
			if !errors.Is(c.err, projection.ErrRegisteredTwice) || c.err.Error() != c.want {
				t.Errorf("%v; want ErrRegisteredTwice reading %q", c.err, c.want)
			}
		}
	})

	t.Run("EmptyCorrelationIDIsDeadLettered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		s := &rawSaga[counterState]{name: "raw", correlate: addedID,
			handle: func(ctx context.Context, inst *saga.Instance[counterState], e eventstore.Event) error {
				inst.State.Sum++
				return nil
			}}
		if err := saga.Register[counterState](r, s, &saga.Config{Store: b.store}); err != nil {
			t.Fatal(err)
		}
		b.append(t, "no-id", Added{ID: "", N: 1})
		b.append(t, "fine", Added{ID: "a", N: 1})
		catchUp(t, r)
		// Permanent: one attempt although the policy allows 2 retries.
		b.wantDeadLetter(t, "raw", "no-id", 1, `saga "raw"`, "empty instance ID", "invalid event")
		if st, err := saga.Lookup[counterState](t.Context(), b.db.Pool, "", "raw", "a"); err != nil || st.State.Sum != 1 {
			t.Fatalf("instance a: %+v, %v", st, err)
		}
		if _, err := saga.Lookup[counterState](t.Context(), b.db.Pool, "", "raw", ""); !errorsIs(err, saga.ErrNotFound) {
			t.Fatalf("an instance with an empty ID: %v", err)
		}
	})

	t.Run("UndecodableEventIsDeadLettered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		register(t, r, counterSaga(b.reg, 0), &saga.Config{Store: b.store})
		if _, err := b.store.Append(t.Context(), "odd", eventstore.Any,
			eventstore.EventData{Type: "test.added", Data: json.RawMessage(`{"id": 5}`)}); err != nil {
			t.Fatal(err)
		}
		catchUp(t, r)
		b.wantDeadLetter(t, counterName, "odd", 1, `saga "counter": correlate event`)
	})

	t.Run("UndecodableStateIsDeadLettered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		register(t, r, counterSaga(b.reg, 0), &saga.Config{Store: b.store})
		if _, err := b.db.Pool.Exec(t.Context(), `INSERT INTO annals.saga_states (saga, correlation_id, state, version)
			VALUES ('counter', 'bad', '{"sum": "not a number"}', 1)`); err != nil {
			t.Fatal(err)
		}
		b.append(t, "s", Added{ID: "bad", N: 1})
		b.append(t, "s2", Added{ID: "good", N: 1})
		catchUp(t, r)
		b.wantDeadLetter(t, counterName, "s", 1, `saga "counter" instance "bad": decode state`, "not a number", "counterState")
		if st := b.lookup(t, "good"); st.State.Sum != 1 {
			t.Fatalf("instance good: %+v", st)
		}
		if n := len(b.effects(t, "bad")); n != 0 {
			t.Fatalf("%d effects of the undecodable instance", n)
		}
	})

	t.Run("UnencodableStateIsDeadLettered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		type floaty struct{ F float64 }
		s := &rawSaga[floaty]{name: "floaty", correlate: addedID,
			handle: func(ctx context.Context, inst *saga.Instance[floaty], e eventstore.Event) error {
				inst.State.F = math.NaN()
				_, err := inst.Append(ctx, "floaty-effects", eventstore.Any, eventstore.NewEvent(Effect{ID: inst.ID()}))
				return err
			}}
		if err := saga.Register[floaty](r, s, &saga.Config{Store: b.store}); err != nil {
			t.Fatal(err)
		}
		b.append(t, "s", Added{ID: "nan", N: 1})
		catchUp(t, r)
		b.wantDeadLetter(t, "floaty", "s", 1, `saga "floaty" instance "nan": encode state`, "NaN")
		if n := b.count(t, `SELECT count(*) FROM annals.events WHERE stream_id = 'floaty-effects'`); n != 0 {
			t.Fatalf("the effect of a handler whose state cannot be saved was committed")
		}
	})

	// A panic in a saga's code is retried, then dead-lettered, like an
	// error it returned, and the dead letter names the saga (and instance).
	t.Run("PanicIsDeadLetteredWithTheSagaAndInstance", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		handles := &rawSaga[counterState]{name: "panicky", correlate: addedID,
			handle: func(ctx context.Context, inst *saga.Instance[counterState], e eventstore.Event) error {
				panic("boom")
			}}
		correlates := &rawSaga[counterState]{name: "panicky-correlate",
			correlate: func(e eventstore.Event) (string, bool) { panic("no route") },
			handle: func(ctx context.Context, inst *saga.Instance[counterState], e eventstore.Event) error {
				return nil
			}}
		for _, s := range []*rawSaga[counterState]{handles, correlates} {
			if err := saga.Register[counterState](r, s, &saga.Config{Store: b.store}); err != nil {
				t.Fatal(err)
			}
		}
		b.append(t, "s", Added{ID: "a", N: 1})
		catchUp(t, r)
		b.wantDeadLetter(t, "panicky", "s", 3, `saga "panicky" instance "a": handler panicked: boom`)
		b.wantDeadLetter(t, "panicky-correlate", "s", 3, `saga "panicky-correlate": correlate event`, "handler panicked: no route")
	})

	// An effect's error reaches the dead letter naming the saga and the
	// instance once, then what failed.
	t.Run("EffectErrorNamesTheInstanceOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		b.append(t, "taken", Expired{ID: "x"}) // a stream that exists; not an Added, so no saga handles it
		effects := map[string]func(ctx context.Context, inst *saga.Instance[counterState]) error{
			"appends": func(ctx context.Context, inst *saga.Instance[counterState]) error {
				_, err := inst.Append(ctx, "taken", eventstore.NoStream, eventstore.NewEvent(Effect{ID: inst.ID()}))
				return err
			},
			"schedules": func(ctx context.Context, inst *saga.Instance[counterState]) error {
				_, err := inst.ScheduleAfter(ctx, time.Minute, "s", eventstore.NewEvent(Deadline{ID: inst.ID()}))
				return err
			},
			"commands": func(ctx context.Context, inst *saga.Instance[counterState]) error {
				_, err := saga.Update[counterState](ctx, inst, tallies(t, b.store), "t-1", func(*Tally) error { return nil })
				return err
			},
		}
		for name, effect := range effects {
			s := &rawSaga[counterState]{name: name, correlate: addedID,
				handle: func(ctx context.Context, inst *saga.Instance[counterState], e eventstore.Event) error {
					return effect(ctx, inst)
				}}
			if err := saga.Register[counterState](r, s, &saga.Config{Store: b.store}); err != nil {
				t.Fatal(err)
			}
		}
		b.append(t, "s", Added{ID: "a", N: 1})
		catchUp(t, r)
		for name, what := range map[string]string{
			"appends":   `append to "taken"`,
			"schedules": "schedule: saga: no scheduler configured",
			"commands":  `command on `,
		} {
			b.wantDeadLetter(t, name, "s", 3, `saga "`+name+`" instance "a": `+what)
			for _, dl := range b.deadLetters(t, name) {
				if n := strings.Count(dl.Error, `instance "a"`); n != 1 {
					t.Errorf("saga %s: the dead letter's error names the instance %d times: %s", name, n, dl.Error)
				}
			}
		}
	})

	t.Run("ScheduleWithoutScheduler", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		register(t, r, counterSaga(b.reg, time.Minute), &saga.Config{Store: b.store})
		b.append(t, "s", Added{ID: "a", N: 1})
		catchUp(t, r)
		b.wantDeadLetter(t, counterName, "s", 3, "no scheduler configured")
	})

	t.Run("EffectAfterHandleReturned", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		var kept *saga.Instance[counterState]
		s := &rawSaga[counterState]{name: "keeper", correlate: addedID,
			handle: func(ctx context.Context, inst *saga.Instance[counterState], e eventstore.Event) error {
				kept = inst
				return nil
			}}
		if err := saga.Register[counterState](r, s, &saga.Config{Store: b.store}); err != nil {
			t.Fatal(err)
		}
		b.append(t, "s", Added{ID: "a", N: 1})
		catchUp(t, r)
		if _, err := kept.Append(t.Context(), "late", eventstore.Any, eventstore.NewEvent(Effect{})); err == nil ||
			!strings.Contains(err.Error(), "after Handle returned") {
			t.Fatalf("Append after Handle returned: %v", err)
		}
		if _, err := kept.Cancel(t.Context(), kept.State.Timer); err == nil {
			t.Fatal("Cancel after Handle returned succeeded")
		}
	})
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
