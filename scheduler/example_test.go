package scheduler_test

import (
	"context"
	"fmt"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/scheduler"
)

// stoppedClock is a Clock that shows a fixed time, as a test's would.
type stoppedClock struct{ now time.Time }

func (c *stoppedClock) Now() time.Time                         { return c.now }
func (c *stoppedClock) After(d time.Duration) <-chan time.Time { return make(chan time.Time) }

// Schedule an event for later; FireDue (or a running dispatcher, Run)
// appends it once it is due by the scheduler's clock.
func ExampleScheduler_Schedule() {
	ctx := context.Background()
	db, done, err := annalstest.Open(ctx, nil) // in your code: pgxpool.New + migrations.Up
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = done() }()
	store, _ := eventstore.New(db.Pool, nil)
	clock := &stoppedClock{now: time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)}
	sched, err := scheduler.New(store, &scheduler.Config{Clock: clock})
	if err != nil {
		fmt.Println(err)
		return
	}

	// Expire the order in 30 minutes unless it is paid.
	id, err := sched.Schedule(ctx, nil, clock.now.Add(30*time.Minute), "order-17",
		eventstore.EventData{Type: "order.payment_deadline", Data: map[string]string{"order": "17"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	n, _ := sched.FireDue(ctx)
	fmt.Println("fired at 09:00:", n)

	clock.now = clock.now.Add(30 * time.Minute)
	n, _ = sched.FireDue(ctx)
	fmt.Println("fired at 09:30:", n)

	cancelled, _ := sched.Cancel(ctx, nil, id)
	fmt.Println("cancel after firing:", cancelled)
	for e, err := range store.ReadStream(ctx, "order-17", 0) {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(e.StreamVersion, e.Type, string(e.Data))
	}
	// Output:
	// fired at 09:00: 0
	// fired at 09:30: 1
	// cancel after firing: false
	// 1 order.payment_deadline {"order":"17"}
}

// A cron task appends an event at every tick, in the task's time zone.
func ExampleScheduler_AddTask() {
	ctx := context.Background()
	db, done, err := annalstest.Open(ctx, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = done() }()
	store, _ := eventstore.New(db.Pool, nil)
	clock := &stoppedClock{now: time.Date(2026, 3, 27, 12, 0, 0, 0, time.UTC)}
	sched, _ := scheduler.New(store, &scheduler.Config{Clock: clock})

	err = sched.AddTask(ctx, scheduler.Task{
		Name:     "nightly-report",
		Spec:     "30 2 * * *", // 02:30 every day...
		TimeZone: "Europe/Berlin",
		StreamID: "reports",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// ...which on 2026-03-29 does not exist in Berlin (clocks jump from 02:00
	// to 03:00), so that day has no tick.
	for range 3 {
		tasks, _ := sched.Tasks(ctx)
		next := tasks[0].NextTick
		clock.now = next
		if _, err := sched.FireDue(ctx); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("fired", next.In(mustZone("Europe/Berlin")).Format("Jan 2 15:04 MST"), "=", next.UTC().Format("15:04 UTC"))
	}
	// Output:
	// fired Mar 28 02:30 CET = 01:30 UTC
	// fired Mar 30 02:30 CEST = 00:30 UTC
	// fired Mar 31 02:30 CEST = 00:30 UTC
}

func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}
