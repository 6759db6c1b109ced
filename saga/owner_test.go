package saga_test

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
)

// streamSaga is a saga named name that handles the Added and Closed events
// of stream "in-<name>" only: Added schedules a Deadline timer in an hour,
// Closed completes the instance.
type streamSaga struct{ name string }

func (s streamSaga) Name() string { return s.name }

func (s streamSaga) Correlate(e eventstore.Event) (string, bool) {
	if e.StreamID != "in-"+s.name {
		return "", false
	}
	var v struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(e.Data, &v); err != nil {
		return "", false
	}
	return v.ID, true
}

func (s streamSaga) Handle(ctx context.Context, inst *saga.Instance[counterState], e eventstore.Event) error {
	switch e.Type {
	case "test.added":
		_, err := inst.ScheduleAfter(ctx, time.Hour, "deadlines-"+s.name, eventstore.NewEvent(Deadline{ID: inst.ID()}))
		return err
	case "test.closed":
		inst.Complete()
		return nil
	}
	return errors.Newf("unexpected %s", e.Type)
}

// Saga "order" instance "fulfil:1" and saga "order:fulfil" instance "1"
// would both own "saga:order:fulfil:1" if the tag were name:id. Completing
// the first must leave the second's timer pending, and it fires.
func TestOwnerTagsOfTwoSagasDoNotCollide(t *testing.T) {
	t.Parallel()
	b := setup(t)
	clock := newFakeClock(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
	sched, err := scheduler.New(b.store, &scheduler.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	r := b.runner(t)
	first, second := streamSaga{name: "order"}, streamSaga{name: "order:fulfil"}
	for _, s := range []streamSaga{first, second} {
		if err := saga.Register(r, saga.Saga[counterState](s), &saga.Config{Store: b.store, Scheduler: sched, Clock: clock}); err != nil {
			t.Fatal(err)
		}
	}
	if a, b := saga.Owner(first.name, "fulfil:1"), saga.Owner(second.name, "1"); a == b {
		t.Errorf("saga.Owner gives both instances the tag %q", a)
	}
	b.append(t, "in-order", Added{ID: "fulfil:1", N: 1})
	b.append(t, "in-order:fulfil", Added{ID: "1", N: 1})
	catchUp(t, r)
	owners := func() map[string]int {
		t.Helper()
		ts, err := sched.Timers(t.Context(), 10)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int{}
		for _, ti := range ts {
			m[ti.Owner]++
		}
		return m
	}
	if got := owners(); len(got) != 2 {
		t.Fatalf("timer owners %v; want two distinct owners with one timer each", got)
	}

	b.append(t, "in-order", Closed{ID: "fulfil:1"})
	catchUp(t, r)
	got := owners()
	if len(got) != 1 || got[saga.Owner(second.name, "1")] != 1 {
		t.Fatalf("after saga %q instance %q completed, timer owners are %v; want only %q's",
			first.name, "fulfil:1", got, saga.Owner(second.name, "1"))
	}
	clock.Advance(2 * time.Hour)
	if n, err := sched.FireDue(t.Context()); err != nil || n != 1 {
		t.Fatalf("FireDue = %d, %v; want the surviving timer to fire", n, err)
	}
}

// An instance ID with a tab or a newline, or long enough that its owner
// tag is over scheduler.MaxOwnerBytes, schedules timers: its owner tag is
// then a hash that the scheduler takes (ScheduleTimer refused the plain
// tag with ErrInvalidTimer, and the event was dead-lettered). Completing
// the instance cancels its timers, and those an earlier annals stored
// under the plain tag. An ordinary ID keeps its plain tag.
func TestOwnerOfAnyInstanceID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	clock := newFakeClock(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
	sched, err := scheduler.New(b.store, &scheduler.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	r := b.runner(t)
	s := streamSaga{name: "odd"}
	if err := saga.Register(r, saga.Saga[counterState](s), &saga.Config{Store: b.store, Scheduler: sched, Clock: clock}); err != nil {
		t.Fatal(err)
	}
	if got := saga.Owner("order", "o-17"); got != "saga:5:order:o-17" {
		t.Errorf(`saga.Owner("order", "o-17") = %q; want the plain tag`, got)
	}
	ids := []string{"tab\tid", "line\nid", strings.Repeat("x", scheduler.MaxOwnerBytes), "ok-1"}
	owners := map[string]string{}
	for _, id := range ids {
		o := saga.Owner(s.name, id)
		if err := scheduler.CheckOwner(o); err != nil {
			t.Fatalf("saga.Owner(%q, %.20q) = %.40q: %v", s.name, id, o, err)
		}
		if prev, dup := owners[o]; dup {
			t.Fatalf("instances %.20q and %.20q share the owner %q", prev, id, o)
		}
		owners[o] = id
		b.append(t, "in-"+s.name, Added{ID: id, N: 1})
	}
	catchUp(t, r)
	if n := b.count(t, `SELECT count(*) FROM annals.dead_letters`); n != 0 {
		t.Fatalf("%d events dead-lettered", n)
	}
	ts, err := sched.Timers(t.Context(), 10)
	if err != nil || len(ts) != len(ids) {
		t.Fatalf("Timers = %d, %v; want one per instance", len(ts), err)
	}
	for _, ti := range ts {
		if _, ok := owners[ti.Owner]; !ok {
			t.Errorf("a timer is owned by %.40q, no instance's saga.Owner", ti.Owner)
		}
	}
	// A timer stored under the plain tag, as before owners were checked.
	plain := "saga:3:odd:tab\tid"
	if _, err := b.db.Pool.Exec(t.Context(), `INSERT INTO annals.timers (id, due_at, stream_id, payload, payload_json, owner)
		SELECT gen_random_uuid(), due_at, stream_id, payload, payload_json, $2 FROM annals.timers WHERE owner = $1`,
		saga.Owner(s.name, "tab\tid"), plain); err != nil {
		t.Fatal(err)
	}

	for _, id := range ids[:3] {
		b.append(t, "in-"+s.name, Closed{ID: id})
	}
	catchUp(t, r)
	if n := b.count(t, `SELECT count(*) FROM annals.dead_letters`); n != 0 {
		t.Fatalf("%d events dead-lettered", n)
	}
	ts, err = sched.Timers(t.Context(), 10)
	if err != nil || len(ts) != 1 || ts[0].Owner != saga.Owner(s.name, "ok-1") {
		t.Fatalf("after the odd instances completed, timers %+v, %v; want only ok-1's", ts, err)
	}
}
