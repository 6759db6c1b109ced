package saga_test

import (
	"context"
	"testing"
	"time"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

// Unregistered is an event type the test registry does not know.
type Unregistered struct{ ID string }

// A timer the scheduler refuses as invalid (scheduler.ErrInvalidTimer: an
// event type not registered, a zero or unstorable due time, no events, an
// empty stream ID, contradictory expectations) is refused again on every
// retry, for the handler computes it from the same event and state: the
// event is dead-lettered after one attempt, as for failure.Permanent,
// naming the saga, the instance and the cause. Before, it was retried
// (three attempts here, over ~7 s with the default policy) first.
func TestInvalidTimerIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sched, err := scheduler.New(b.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := b.runner(t)
	cases := map[string]struct {
		schedule func(ctx context.Context, inst *saga.Instance[counterState]) error
		want     string
	}{
		"unregistered": {func(ctx context.Context, inst *saga.Instance[counterState]) error {
			_, err := inst.ScheduleAfter(ctx, time.Second, "x-"+inst.ID(), eventstore.NewEvent(Unregistered{ID: inst.ID()}))
			return err
		}, "unknown event type"},
		"zero-time": {func(ctx context.Context, inst *saga.Instance[counterState]) error {
			_, err := inst.Schedule(ctx, time.Time{}, "x-"+inst.ID(), eventstore.NewEvent(Deadline{ID: inst.ID()}))
			return err
		}, "has no due time"},
		"year-10000": {func(ctx context.Context, inst *saga.Instance[counterState]) error {
			_, err := inst.Schedule(ctx, time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), "x-"+inst.ID(), eventstore.NewEvent(Deadline{ID: inst.ID()}))
			return err
		}, "years 1 to 9999"},
		"no-events": {func(ctx context.Context, inst *saga.Instance[counterState]) error {
			_, err := inst.ScheduleAfter(ctx, time.Second, "x-"+inst.ID())
			return err
		}, "has no events"},
		"no-stream": {func(ctx context.Context, inst *saga.Instance[counterState]) error {
			_, err := inst.ScheduleAfter(ctx, time.Second, "", eventstore.NewEvent(Deadline{ID: inst.ID()}))
			return err
		}, "stream_id: is empty"},
		"both-expectations": {func(ctx context.Context, inst *saga.Instance[counterState]) error {
			_, err := inst.ScheduleTimer(ctx, scheduler.Timer{At: inst.Now().Add(time.Second), StreamID: "x-" + inst.ID(),
				ExpectNoStream: true, Expected: 3, Events: []eventstore.EventData{eventstore.NewEvent(Deadline{ID: inst.ID()})}})
			return err
		}, "sets both ExpectNoStream and Expected"},
	}
	for name, c := range cases {
		s := &rawSaga[counterState]{name: name, correlate: addedID,
			handle: func(ctx context.Context, inst *saga.Instance[counterState], e eventstore.Event) error {
				return c.schedule(ctx, inst)
			}}
		if err := saga.Register[counterState](r, s, &saga.Config{Store: b.store, Scheduler: sched}); err != nil {
			t.Fatal(err)
		}
	}
	b.append(t, "s", Added{ID: "a", N: 1})
	catchUp(t, r)
	for name, c := range cases {
		// One attempt although the policy allows 2 retries.
		b.wantDeadLetter(t, name, "s", 1, `saga "`+name+`" instance "a": schedule a timer`, c.want)
	}
	if n := b.count(t, `SELECT count(*) FROM annals.timers`); n != 0 {
		t.Fatalf("%d timers stored", n)
	}
}
