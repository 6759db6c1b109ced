package testkit_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
	"github.com/annals-dev/annals/testkit"
)

// The saga under test: a signed-up user gets a Welcome at once and, unless
// they verify within a day, a Nudge; verifying or being nudged completes it.
type signedUp struct {
	User string `json:"user"`
}

type verified struct {
	User string `json:"user"`
}

type verifyDeadline struct {
	User string `json:"user"`
}

type welcome struct {
	User string `json:"user"`
}

type nudge struct {
	User string `json:"user"`
}

type onboarding struct {
	Welcomed bool `json:"welcomed"`
	Nudged   bool `json:"nudged"`
	Verified bool `json:"verified"`
}

func sagaRegistry() *eventstore.Registry {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[signedUp](reg, "test.signedUp")
	eventstore.MustRegister[verified](reg, "test.verified")
	eventstore.MustRegister[verifyDeadline](reg, "test.verifyDeadline")
	eventstore.MustRegister[welcome](reg, "test.welcome")
	eventstore.MustRegister[nudge](reg, "test.nudge")
	return reg
}

func onboardingSaga(reg *eventstore.Registry) *saga.Typed[onboarding] {
	s := saga.New[onboarding]("onboarding", reg)
	saga.On(s, func(e eventstore.Envelope[signedUp]) string { return e.Data.User },
		func(ctx context.Context, inst *saga.Instance[onboarding], e eventstore.Envelope[signedUp]) error {
			if e.Data.User == "mallory" {
				return errors.New("mallory is not welcome")
			}
			inst.State.Welcomed = true
			if _, err := inst.Append(ctx, "mail-"+inst.ID(), eventstore.NoStream, eventstore.NewEvent(welcome{User: inst.ID()})); err != nil {
				return err
			}
			_, err := inst.ScheduleAfter(ctx, 24*time.Hour, "user-"+inst.ID(), eventstore.NewEvent(verifyDeadline{User: inst.ID()}))
			return err
		})
	saga.On(s, func(e eventstore.Envelope[verified]) string { return e.Data.User },
		func(ctx context.Context, inst *saga.Instance[onboarding], e eventstore.Envelope[verified]) error {
			inst.State.Verified = true
			inst.Complete()
			return nil
		})
	saga.On(s, func(e eventstore.Envelope[verifyDeadline]) string { return e.Data.User },
		func(ctx context.Context, inst *saga.Instance[onboarding], e eventstore.Envelope[verifyDeadline]) error {
			inst.State.Nudged = true
			inst.Complete()
			_, err := inst.Append(ctx, "mail-"+inst.ID(), eventstore.Any, eventstore.NewEvent(nudge{User: inst.ID()}))
			return err
		})
	return s
}

func effectTypes(es []eventstore.Event) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.StreamID + ":" + e.Type
	}
	return out
}

func TestReplaySaga(t *testing.T) {
	t.Parallel()
	reg := sagaRegistry()
	opts := &testkit.SagaReplayOptions{ReplayOptions: testkit.ReplayOptions{Registry: reg}}

	t.Run("DeadlineFires", func(t *testing.T) {
		t.Parallel()
		r := testkit.ReplaySaga(t, onboardingSaga(reg), opts, testkit.Stream("user-ann", signedUp{User: "ann"}))
		if _, ok := r.Find(t, "nobody"); ok {
			t.Error("Find found an instance no event started")
		}
		if st, ok := r.Find(t, "ann"); !ok || !st.State.Welcomed {
			t.Errorf("Find(ann): %+v, %v", st, ok)
		}
		if st := r.Instance(t, "ann"); !st.State.Welcomed || st.Completed {
			t.Fatalf("ann: %+v", st)
		}
		if got := effectTypes(r.Effects(t)); strings.Join(got, " ") != "mail-ann:test.welcome" {
			t.Fatalf("effects %q", got)
		}
		ts := r.Timers(t)
		if len(ts) != 1 || !ts[0].DueAt.Equal(testkit.DefaultSagaStart.Add(24*time.Hour)) || ts[0].Owner != "saga:10:onboarding:ann" {
			t.Fatalf("timers %+v; want one due a day after the start", ts)
		}
		if n := r.Advance(t, 23*time.Hour); n != 0 {
			t.Fatalf("%d timers fired after 23h", n)
		}
		if n := r.Advance(t, time.Hour); n != 1 {
			t.Fatalf("%d timers fired after 24h, want 1", n)
		}
		if st := r.Instance(t, "ann"); !st.State.Nudged || !st.Completed {
			t.Fatalf("ann after the deadline: %+v", st)
		}
		want := "mail-ann:test.welcome user-ann:test.verifyDeadline mail-ann:test.nudge"
		if got := effectTypes(r.Effects(t)); strings.Join(got, " ") != want {
			t.Fatalf("effects %q, want %q", got, want)
		}
	})

	t.Run("CompletedBeforeTheDeadline", func(t *testing.T) {
		t.Parallel()
		r := testkit.ReplaySaga(t, onboardingSaga(reg), opts, testkit.Stream("user-bob", signedUp{User: "bob"}))
		r.Append(t, testkit.Stream("user-bob", verified{User: "bob"}))
		if len(r.Timers(t)) != 0 {
			t.Fatalf("timers left after completing: %+v", r.Timers(t))
		}
		if n := r.Advance(t, 48*time.Hour); n != 0 {
			t.Fatalf("%d timers fired", n)
		}
		if st := r.Instance(t, "bob"); !st.State.Verified || st.State.Nudged || !st.Completed {
			t.Fatalf("bob: %+v", st)
		}
	})

	t.Run("HandlerErrorFailsTheTest", func(t *testing.T) {
		t.Parallel()
		ft := &replayTB{TB: t}
		var r *testkit.SagaReplay[onboarding]
		fatals := runReplayTB(ft, func() {
			r = testkit.ReplaySaga(ft, onboardingSaga(reg), opts, testkit.Stream("user-mallory", signedUp{User: "mallory"}))
		})
		if len(fatals) != 1 || !strings.Contains(fatals[0], "mallory is not welcome") || !strings.Contains(fatals[0], `saga "onboarding" instance "mallory"`) {
			t.Fatalf("fatals %q; want the handler's error", fatals)
		}
		if r != nil {
			t.Fatal("ReplaySaga returned after failing the test")
		}
	})

	t.Run("BadEventFailsBeforeADatabase", func(t *testing.T) {
		t.Parallel()
		ft := &replayTB{TB: t}
		fatals := runReplayTB(ft, func() {
			testkit.ReplaySaga(ft, onboardingSaga(reg), opts, struct{ X int }{1})
		})
		if len(fatals) != 1 || !strings.Contains(fatals[0], "not in ReplayOptions.Registry") {
			t.Fatalf("fatals %q", fatals)
		}
	})
}

// The ticker saga: started, it schedules a tick in 2 hours; each tick it
// handles records Now() and schedules the next tick 2 hours later.
type tickerStarted struct {
	ID string `json:"id"`
}

type tick struct {
	ID string `json:"id"`
}

type ticker struct {
	Seen []time.Time `json:"seen"`
}

func tickerSaga(reg *eventstore.Registry) *saga.Typed[ticker] {
	s := saga.New[ticker]("ticker", reg)
	saga.On(s, func(e eventstore.Envelope[tickerStarted]) string { return e.Data.ID },
		func(ctx context.Context, inst *saga.Instance[ticker], e eventstore.Envelope[tickerStarted]) error {
			_, err := inst.ScheduleAfter(ctx, 2*time.Hour, "ticks-"+inst.ID(), eventstore.NewEvent(tick{ID: inst.ID()}))
			return err
		})
	saga.On(s, func(e eventstore.Envelope[tick]) string { return e.Data.ID },
		func(ctx context.Context, inst *saga.Instance[ticker], e eventstore.Envelope[tick]) error {
			inst.State.Seen = append(inst.State.Seen, inst.Now())
			_, err := inst.ScheduleAfter(ctx, 2*time.Hour, "ticks-"+inst.ID(), eventstore.NewEvent(tick{ID: inst.ID()}))
			return err
		})
	return s
}

// Advance steps through each due time: a timer scheduled by a timer's
// handler within the window fires in it, and each handler sees Now() equal
// to its timer's due time.
func TestReplaySagaAdvanceStepsThroughDueTimes(t *testing.T) {
	t.Parallel()
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[tickerStarted](reg, "test.tickerStarted")
	eventstore.MustRegister[tick](reg, "test.tick")
	r := testkit.ReplaySaga(t, tickerSaga(reg), &testkit.SagaReplayOptions{ReplayOptions: testkit.ReplayOptions{Registry: reg}},
		testkit.Stream("t-1", tickerStarted{ID: "1"}))
	start := testkit.DefaultSagaStart
	seen := func() string {
		var out []string
		for _, s := range r.Instance(t, "1").State.Seen {
			out = append(out, s.Sub(start).String())
		}
		return strings.Join(out, " ")
	}

	if n := r.Advance(t, 5*time.Hour); n != 2 {
		t.Errorf("Advance(5h) fired %d timers, want 2 (at 2h and 4h)", n)
	}
	if got := seen(); got != "2h0m0s 4h0m0s" {
		t.Errorf("after 5h the ticks saw Now() = start+[%s], want [2h0m0s 4h0m0s]", got)
	}
	if now := r.Clock.Now(); !now.Equal(start.Add(5 * time.Hour)) {
		t.Errorf("the clock is at start+%v after Advance(5h)", now.Sub(start))
	}
	if ts := r.Timers(t); len(ts) != 1 || !ts[0].DueAt.Equal(start.Add(6*time.Hour)) {
		t.Errorf("pending timers %+v; want one due at start+6h", ts)
	}
	if n := r.Advance(t, time.Hour); n != 1 || seen() != "2h0m0s 4h0m0s 6h0m0s" {
		t.Errorf("Advance(1h) fired %d; ticks at start+[%s]; want 1 at 6h", n, seen())
	}
}

// Advance passes over cron ticks as time would pass: a daily task fires once
// for each night in the window, whatever its missed-tick policy, and the
// saga sees each tick at its own time.
func TestReplaySagaAdvanceFiresEveryCronTick(t *testing.T) {
	t.Parallel()
	for _, policy := range []scheduler.MissedPolicy{scheduler.FireLatest, scheduler.SkipMissed} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			reg := sagaRegistry()
			r := testkit.ReplaySaga(t, onboardingSaga(reg), &testkit.SagaReplayOptions{ReplayOptions: testkit.ReplayOptions{Registry: reg}})
			if err := r.Scheduler.AddTask(t.Context(), scheduler.Task{Name: "nightly", Spec: "30 2 * * *", StreamID: "reports", Missed: policy}); err != nil {
				t.Fatal(err)
			}
			if n := r.Advance(t, 72*time.Hour); n != 3 {
				t.Errorf("Advance(72h) fired %d, want 3 (a tick each night)", n)
			}
			var ticks []string
			for _, e := range r.Effects(t) {
				var td scheduler.TickData
				if err := json.Unmarshal(e.Data, &td); err != nil || e.StreamID != "reports" {
					t.Fatalf("effect %s %s: %v", e.StreamID, e.Type, err)
				}
				ticks = append(ticks, td.Tick.Sub(testkit.DefaultSagaStart).String())
			}
			if got, want := strings.Join(ticks, " "), "2h30m0s 26h30m0s 50h30m0s"; got != want {
				t.Errorf("ticks at start+[%s], want [%s]", got, want)
			}
		})
	}
}

// Without options, or options without a Registry, ReplaySaga uses the
// registry the saga was built with (saga.New): a test repeats nothing.
func TestReplaySagaDefaultsToTheSagasRegistry(t *testing.T) {
	t.Parallel()
	reg := sagaRegistry()
	for name, opts := range map[string]*testkit.SagaReplayOptions{
		"NilOptions":    nil,
		"NilRegistry":   {ReplayOptions: testkit.ReplayOptions{Stream: "user-ann"}},
		"OnlySagaField": {Start: testkit.DefaultSagaStart.Add(time.Hour)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := testkit.ReplaySaga(t, onboardingSaga(reg), opts, testkit.Stream("user-ann", signedUp{User: "ann"}))
			if st := r.Instance(t, "ann"); !st.State.Welcomed {
				t.Fatalf("ann: %+v", st)
			}
			if got := effectTypes(r.Effects(t)); strings.Join(got, " ") != "mail-ann:test.welcome" {
				t.Fatalf("effects %q", got)
			}
			// The store decodes with it too.
			if _, ok := r.Store.Registry().NameOf(welcome{}); !ok {
				t.Fatal("the replay's store does not have the saga's registry")
			}
		})
	}
}
