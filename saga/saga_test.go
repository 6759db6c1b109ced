package saga_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
)

func register(t *testing.T, r *projection.Runner, s saga.Saga[counterState], cfg *saga.Config) {
	t.Helper()
	if err := saga.Register(r, s, cfg); err != nil {
		t.Fatal(err)
	}
}

// effects returns the effect events of instance id, in stream order.
func (b *bundle) effects(t *testing.T, id string) []eventstore.Event {
	t.Helper()
	var out []eventstore.Event
	for e, err := range b.store.ReadStream(t.Context(), "effects-"+id, 0) {
		if errors.Is(err, eventstore.ErrStreamNotFound) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

func TestInstances(t *testing.T) {
	t.Parallel()

	t.Run("IsolatedByID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		register(t, r, counterSaga(b.reg, 0), &saga.Config{Store: b.store})
		b.append(t, "s-1", Added{ID: "a", N: 1}, Added{ID: "b", N: 10}, Added{ID: "a", N: 2})
		b.append(t, "s-2", Added{ID: "b", N: 20}, Added{ID: "a", N: 4})
		catchUp(t, r)
		a, bb := b.lookup(t, "a"), b.lookup(t, "b")
		if a.State.Sum != 7 || a.Version != 3 || !slices.Equal(a.State.Seen, []string{"s-1@1", "s-1@3", "s-2@2"}) {
			t.Errorf("instance a: %+v", a)
		}
		if bb.State.Sum != 30 || bb.Version != 2 || !slices.Equal(bb.State.Seen, []string{"s-1@2", "s-2@1"}) {
			t.Errorf("instance b: %+v", bb)
		}
		if n := len(b.effects(t, "a")); n != 3 {
			t.Errorf("instance a has %d effects, want 3", n)
		}
		if n := len(b.effects(t, "b")); n != 2 {
			t.Errorf("instance b has %d effects, want 2", n)
		}
	})

	t.Run("StreamOrderUnderConcurrentWriters", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		register(t, r, counterSaga(b.reg, 0), &saga.Config{Store: b.store, Options: &projection.Options{BatchSize: 7}})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}()
		// Four writers append events of instance x while the saga runs: two
		// to one shared stream, two to streams of their own.
		streams := []string{"x-shared", "x-shared", "x-2", "x-3"}
		const each = 60
		var wg sync.WaitGroup
		var failed atomic.Value
		for w, stream := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					n := 1 + (w*each+i)%5
					evs := []eventstore.EventData{eventstore.NewEvent(Added{ID: "x", N: n})}
					if _, err := b.store.Append(ctx, stream, eventstore.Any, evs...); err != nil {
						failed.Store(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			t.Fatal(err)
		}
		total := int64(len(streams) * each)
		annalstest.WaitFor(t, 30*time.Second, func() bool {
			st, err := saga.Lookup[counterState](t.Context(), b.db.Pool, "", counterName, "x")
			return err == nil && st.Version == total
		})
		st := b.lookup(t, "x")
		// The saga saw every event once, in log (commit) order, which is
		// stream-version order within each stream.
		rows, err := b.db.Pool.Query(t.Context(), `SELECT stream_id || '@' || stream_version FROM annals.events
			WHERE event_type = 'test.added' ORDER BY global_sequence`)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		var s string
		if _, err := rowsEach(rows, &s, func() { want = append(want, s) }); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(st.State.Seen, want) {
			t.Fatalf("the saga saw\n%v\nthe log holds\n%v", st.State.Seen, want)
		}
		last := map[string]int{}
		for _, seen := range st.State.Seen {
			var stream string
			var v int
			i := strings.LastIndexByte(seen, '@')
			stream = seen[:i]
			if _, err := fmt.Sscan(seen[i+1:], &v); err != nil {
				t.Fatal(err)
			}
			if v != last[stream]+1 {
				t.Fatalf("%s handled after version %d of %s", seen, last[stream], stream)
			}
			last[stream] = v
		}
		effects := b.effects(t, "x")
		if int64(len(effects)) != total {
			t.Fatalf("%d effects for %d events", len(effects), total)
		}
	})

	t.Run("EffectsCarryCausationAndCorrelation", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		register(t, r, counterSaga(b.reg, 0), &saga.Config{Store: b.store})
		res, err := b.store.Append(t.Context(), "s", eventstore.Any,
			eventstore.EventData{Data: Added{ID: "a", N: 1}, Metadata: eventstore.Metadata{CorrelationID: "request-7"}},
			eventstore.EventData{Data: Added{ID: "a", N: 2}})
		if err != nil {
			t.Fatal(err)
		}
		catchUp(t, r)
		effects := b.effects(t, "a")
		if len(effects) != 2 {
			t.Fatalf("%d effects, want 2", len(effects))
		}
		first, second := res.Events[0].ID.String(), res.Events[1].ID.String()
		if m := effects[0].Metadata; m.CausationID != first || m.CorrelationID != "request-7" {
			t.Errorf("first effect's metadata %+v, want causation %s and correlation request-7", m, first)
		}
		if m := effects[1].Metadata; m.CausationID != second || m.CorrelationID != second {
			t.Errorf("second effect's metadata %+v, want causation and correlation %s", m, second)
		}
	})

	t.Run("CompletedIgnoresLaterEvents", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.runner(t)
		register(t, r, counterSaga(b.reg, 0), &saga.Config{Store: b.store})
		b.append(t, "s", Added{ID: "a", N: 1}, Closed{ID: "a"}, Added{ID: "a", N: 100}, Closed{ID: "a"})
		catchUp(t, r)
		st := b.lookup(t, "a")
		if !st.Completed || st.CompletedAt.IsZero() || st.Version != 2 || st.State.Sum != 1 {
			t.Fatalf("instance a: %+v; want completed after 2 events with sum 1", st)
		}
		if n := len(b.effects(t, "a")); n != 1 {
			t.Fatalf("%d effects, want 1 (the Added after Closed is ignored)", n)
		}
		if n := b.count(t, `SELECT count(*) FROM annals.dead_letters`); n != 0 {
			t.Fatalf("%d dead letters", n)
		}
	})

	t.Run("Retention", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		clock := newFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		r := b.runner(t)
		register(t, r, counterSaga(b.reg, 0), &saga.Config{Store: b.store, Clock: clock,
			Retention: time.Hour, PruneInterval: time.Minute})
		b.append(t, "s", Added{ID: "a", N: 1}, Closed{ID: "a"}, Added{ID: "open", N: 1})
		catchUp(t, r)
		if st := b.lookup(t, "a"); !st.Completed || !st.CompletedAt.Equal(clock.Now()) {
			t.Fatalf("instance a: %+v", st)
		}
		clock.Advance(59 * time.Minute)
		b.append(t, "s", Added{ID: "other", N: 1}) // a prune runs: a is not old enough
		catchUp(t, r)
		b.lookup(t, "a")
		clock.Advance(2 * time.Minute)
		b.append(t, "s", Added{ID: "other", N: 1}) // a prune runs and deletes a
		catchUp(t, r)
		if n := b.count(t, `SELECT count(*) FROM annals.saga_states WHERE correlation_id = 'a'`); n != 0 {
			t.Fatalf("the completed instance a is kept 61 minutes after completing; retention is 1h")
		}
		if st := b.lookup(t, "open"); st.Completed || st.Version != 1 {
			t.Fatalf("the open instance: %+v", st)
		}
		// A late event after the prune starts a new instance.
		b.append(t, "s", Closed{ID: "a"})
		catchUp(t, r)
		if st := b.lookup(t, "a"); !st.Completed || st.Version != 1 || st.State.Sum != 0 {
			t.Fatalf("instance a after a late event: %+v; want a new instance", st)
		}
	})

	t.Run("KeptForeverByDefault", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		clock := newFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		r := b.runner(t)
		register(t, r, counterSaga(b.reg, 0), &saga.Config{Store: b.store, Clock: clock})
		b.append(t, "s", Added{ID: "a", N: 1}, Closed{ID: "a"})
		catchUp(t, r)
		clock.Advance(10 * 365 * 24 * time.Hour)
		b.append(t, "s", Added{ID: "other", N: 1})
		catchUp(t, r)
		if st := b.lookup(t, "a"); !st.Completed {
			t.Fatalf("instance a: %+v", st)
		}
	})

	t.Run("VersionConflictIsRetried", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var mu sync.Mutex
		var errs []string
		r, err := projection.NewRunner(b.db.Pool, &projection.Config{Retry: fastRetry, RetryBackoff: 10 * time.Millisecond,
			Hooks: projection.Hooks{OnRetry: func(_ string, _ eventstore.Event, _ int, err error) {
				mu.Lock()
				errs = append(errs, err.Error())
				mu.Unlock()
			}}})
		if err != nil {
			t.Fatal(err)
		}
		interfere := &interfering{Saga: counterSaga(b.reg, 0), b: b, id: "a", at: 2}
		register(t, r, interfere, &saga.Config{Store: b.store})
		b.append(t, "s", Added{ID: "a", N: 1})
		catchUp(t, r) // the instance is stored
		b.append(t, "s", Added{ID: "a", N: 2}, Added{ID: "a", N: 4})
		catchUp(t, r)
		// The second event's save found the version bumped by someone else:
		// its batch rolled back, and the retry reloaded the state.
		mu.Lock()
		defer mu.Unlock()
		if len(errs) != 1 || !strings.Contains(errs[0], "changed concurrently") || !strings.Contains(errs[0], `instance "a"`) {
			t.Fatalf("failures %q; want one version conflict of instance a", errs)
		}
		st := b.lookup(t, "a")
		if st.State.Sum != 7 || st.Version != 4 { // 3 events + the interfering bump
			t.Fatalf("instance a: %+v", st)
		}
		if n := len(b.effects(t, "a")); n != 3 {
			t.Fatalf("%d effects, want 3: the conflicting attempt's effect rolled back", n)
		}
	})
}

// interfering wraps a saga: while instance id handles its at-th event for the
// first time, another session bumps the stored version, as a second writer
// would.
type interfering struct {
	saga.Saga[counterState]
	b     *bundle
	id    string
	at    int64
	fired bool
}

func (s *interfering) Handle(ctx context.Context, inst *saga.Instance[counterState], e eventstore.Event) error {
	if inst.ID() == s.id && inst.Version() == s.at-1 && !s.fired {
		s.fired = true
		if _, err := s.b.db.Pool.Exec(ctx, `UPDATE annals.saga_states SET version = version + 1
			WHERE saga = $1 AND correlation_id = $2`, counterName, s.id); err != nil {
			return err
		}
	}
	return s.Saga.Handle(ctx, inst, e)
}

// rowsEach scans each row's single column into dst and calls fn.
func rowsEach[T any](rows interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close()
}, dst *T, fn func()) (int, error) {
	defer rows.Close()
	n := 0
	for rows.Next() {
		if err := rows.Scan(dst); err != nil {
			return n, err
		}
		fn()
		n++
	}
	return n, rows.Err()
}
