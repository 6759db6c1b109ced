package scheduler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/locktrace"
)

// scheduleMany stores n timers due at `at`, each appending one event
// {"n": i} to one of ten streams, in one transaction.
func scheduleMany(t *testing.T, db *annalstest.DB, s *Scheduler, n int, at time.Time) {
	t.Helper()
	tx, err := db.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(t.Context()) }()
	for i := range n {
		if _, err := s.Schedule(t.Context(), tx, at, fmt.Sprintf("many-%d", i%10), ev("tick", map[string]any{"n": i})); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// checkEachOnce checks that events {"n": 0..n-1} are each stored exactly once.
func checkEachOnce(t *testing.T, db *annalstest.DB, n int) {
	t.Helper()
	var total, distinct, lo, hi int
	err := db.Pool.QueryRow(t.Context(), `
		SELECT count(*), count(DISTINCT (data->>'n')::int), coalesce(min((data->>'n')::int), -1), coalesce(max((data->>'n')::int), -1)
		  FROM annals.events WHERE event_type = 'tick'`).Scan(&total, &distinct, &lo, &hi)
	if err != nil {
		t.Fatal(err)
	}
	if total != n || distinct != n || lo != 0 || hi != n-1 {
		t.Fatalf("events: %d stored, %d distinct, n from %d to %d; want each of 0..%d once", total, distinct, lo, hi, n-1)
	}
}

func TestThreeDispatchersFireAThousandTimersExactlyOnce(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	const n = 1000
	tr := locktrace.New()
	var ss []*Scheduler
	for range 3 {
		ss = append(ss, newTracedScheduler(t, db, &Config{Clock: clock, BatchSize: 50, PollInterval: time.Hour}, tr))
	}
	scheduleMany(t, db, ss[0], n, t0.Add(time.Minute))
	for _, s := range ss {
		run(t, s)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		for _, s := range ss {
			if s.sleeping.Load() == 0 {
				return false
			}
		}
		return true
	})
	_, before := tr.Counts()

	// A bystander appends in a loop while the dispatchers drain the timers:
	// the claims must not make it wait long for the log's append lock.
	bystander, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	lat := make(chan []time.Duration, 1)
	go func() {
		var ds []time.Duration
		defer func() { lat <- ds }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			t1 := time.Now()
			if _, err := bystander.Append(context.Background(), "bystander", eventstore.Any, ev("other", map[string]any{})); err != nil {
				t.Error(err)
				return
			}
			ds = append(ds, time.Since(t1))
		}
	}()

	start := time.Now()
	clock.Advance(time.Minute) // all 1,000 are due at once
	annalstest.WaitFor(t, 60*time.Second, func() bool { return timerRows(t, db) == 0 })
	elapsed := time.Since(start)
	close(stop)
	ds := <-lat
	checkEachOnce(t, db, n)
	// A dispatcher counts a batch once its transaction has committed, so
	// the last batch's count may come just after the rows are gone.
	var sum int64
	var per []int64
	count := func() bool {
		sum, per = 0, per[:0]
		for _, s := range ss {
			per = append(per, s.fired.Load())
			sum += s.fired.Load()
		}
		return sum >= n
	}
	deadline := time.Now().Add(10 * time.Second)
	for !count() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if sum != n {
		t.Fatalf("the dispatchers fired %v timers, %d in all; want %d in all (a timer fired twice or not at all)", per, sum, n)
	}
	under, total := tr.Counts()
	slices.Sort(ds)
	var p50, p99, worst time.Duration
	if len(ds) > 0 {
		p50, p99, worst = ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1]
	}
	t.Logf("3 dispatchers fired %d timers in %v (per dispatcher %v); %d round trips, %d of them under the append lock; "+
		"a concurrent Append loop did %d appends, p50 %v, p99 %v, max %v",
		n, elapsed.Round(time.Millisecond), per, total-before, under,
		len(ds), p50.Round(time.Microsecond), p99.Round(time.Microsecond), worst.Round(time.Microsecond))
	if under != 0 {
		t.Errorf("%d round trips were sent while a claim held the log's append lock; want 0 (appends and COMMIT in one pipeline)", under)
	}
}

func TestKilledClaimerLeavesItsTimersToOthers(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	const n = 40
	a := newScheduler(t, db, &Config{Clock: clock})
	b := newScheduler(t, db, &Config{Clock: clock})
	scheduleMany(t, db, a, n, t0)

	pids := make(chan uint32, 1)
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock) // before the pools close, should the test fail early
	a.afterClaim = func(tx pgx.Tx) {
		pids <- tx.Conn().PgConn().PID()
		<-release
	}
	aDone := make(chan error, 1)
	go func() {
		_, err := a.FireDue(context.Background())
		aDone <- err
	}()
	pid := <-pids

	// While a holds the claim, b skips those timers; it does not wait.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if got, err := b.FireDue(ctx); err != nil || got != 0 {
		t.Fatalf("b.FireDue while a holds the claim = %d, %v; want 0 at once", got, err)
	}

	// Kill a's connection in the middle of its claim.
	var ok bool
	if err := db.Pool.QueryRow(t.Context(), `SELECT pg_terminate_backend($1, 5000)`, int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend = %v, %v", ok, err)
	}
	unblock()
	if err := <-aDone; err == nil {
		t.Fatal("a's FireDue succeeded on a terminated connection")
	}
	if a.fired.Load() != 0 || eventsIn(t, db, "many-0") != 0 {
		t.Fatal("the killed claim fired something")
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		_, err := b.FireDue(t.Context())
		return err == nil && timerRows(t, db) == 0
	})
	checkEachOnce(t, db, n)
	if b.fired.Load() != n {
		t.Errorf("b fired %d, want %d", b.fired.Load(), n)
	}
}

// A dispatcher that hangs in the middle of its claim, connected, loses the
// claimed timers after ClaimTimeout: the server ends its session and
// another dispatcher fires them, each once.
func TestHungClaimerLosesItsTimersToOthers(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	const n = 40
	a := newScheduler(t, db, &Config{Clock: clock, ClaimTimeout: 300 * time.Millisecond})
	b := newScheduler(t, db, &Config{Clock: clock})
	scheduleMany(t, db, a, n, t0)

	claimed := make(chan struct{})
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock) // before the pools close, should the test fail early
	a.afterClaim = func(pgx.Tx) {
		close(claimed)
		<-release // hung, its connection open
	}
	aDone := make(chan error, 1)
	go func() {
		_, err := a.FireDue(context.Background())
		aDone <- err
	}()
	<-claimed // a holds all n timers (one batch), and hangs
	start := time.Now()
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		_, err := b.FireDue(t.Context())
		return err == nil && timerRows(t, db) == 0
	})
	t.Logf("b fired the hung claim's timers %v after the claim", time.Since(start).Round(time.Millisecond))
	unblock()
	if err := <-aDone; err == nil {
		t.Fatal("a's FireDue succeeded after its session was ended")
	}
	checkEachOnce(t, db, n)
	if a.fired.Load() != 0 || b.fired.Load() != n {
		t.Errorf("a fired %d, b %d; want 0 and %d", a.fired.Load(), b.fired.Load(), n)
	}
}

// The same holds for a cron task: a dispatcher hung while it holds the
// task's row loses it after ClaimTimeout, and another fires the tick.
func TestHungCronDispatcherLosesTheTaskToOthers(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	a := newScheduler(t, db, &Config{Clock: clock, ClaimTimeout: 300 * time.Millisecond})
	b := newScheduler(t, db, &Config{Clock: clock})
	claimed := make(chan struct{})
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock)
	var once sync.Once
	a.afterClaim = func(pgx.Tx) { // a holds the task's row, and hangs
		once.Do(func() { close(claimed); <-release })
	}
	task := Task{Name: "hung", Spec: "* * * * *", StreamID: "cron-hung",
		Event: func(time.Time) (eventstore.EventData, error) { return ev("tick", map[string]any{"n": 0}), nil }}
	for _, s := range []*Scheduler{a, b} {
		if err := s.AddTask(t.Context(), task); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Minute)
	aDone := make(chan error, 1)
	go func() {
		_, err := a.FireDue(context.Background())
		aDone <- err
	}()
	<-claimed
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		_, err := b.FireDue(t.Context())
		return err == nil && eventsIn(t, db, "cron-hung") == 1
	})
	unblock()
	<-aDone
	checkEachOnce(t, db, 1)
}

func TestFailingTimerIsRetriedThenKeptAsFailedWithoutHoldingBackOthers(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock, MaxAttempts: 3, RetryBackoff: time.Second})
	ctx := t.Context()
	e := []eventstore.EventData{ev("x", map[string]any{})}
	// Fails forever: the stream will never be at version 5.
	bad, err := s.ScheduleTimer(ctx, nil, Timer{At: t0, StreamID: "bad", Expected: eventstore.Exact(5), Events: e, Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	// Fails until its stream exists.
	if _, err := s.ScheduleTimer(ctx, nil, Timer{At: t0, StreamID: "later", Expected: eventstore.StreamExists, Events: e}); err != nil {
		t.Fatal(err)
	}
	// Fine, in the same batch.
	for i := range 3 {
		if _, err := s.Schedule(ctx, nil, t0, fmt.Sprintf("good-%d", i), e...); err != nil {
			t.Fatal(err)
		}
	}
	attempts := func(id TimerID) (int, string, bool, time.Time) {
		var a int
		var msg string
		var failed bool
		var due time.Time
		if err := db.Pool.QueryRow(ctx, `SELECT attempts, coalesce(last_error, ''), failed_at IS NOT NULL, due_at FROM annals.timers WHERE id = $1`, id).
			Scan(&a, &msg, &failed, &due); err != nil {
			t.Fatal(err)
		}
		return a, msg, failed, due
	}

	if got := fireDue(t, s); got != 3 {
		t.Fatalf("first pass fired %d, want the 3 good ones", got)
	}
	a, msg, failed, due := attempts(bad)
	if a != 1 || failed || !strings.Contains(msg, "wrong expected version") || !due.Equal(t0.Add(time.Second)) {
		t.Fatalf("after 1 failure: attempts %d, failed %v, due %v, error %q", a, failed, due, msg)
	}
	if _, err := s.store.Append(ctx, "later", eventstore.NoStream, e...); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if got := fireDue(t, s); got != 1 || eventsIn(t, db, "later") != 2 {
		t.Fatalf("second pass fired %d; want the timer whose stream now exists", got)
	}
	if a, _, failed, due = attempts(bad); a != 2 || failed || !due.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("after 2 failures: attempts %d, failed %v, due %v (want backoff 2 s)", a, failed, due)
	}
	clock.Advance(time.Second)
	if got := fireDue(t, s); got != 0 {
		t.Fatalf("fired %d before the backoff ended", got)
	}
	if a, _, _, _ = attempts(bad); a != 2 {
		t.Fatalf("attempted during backoff: attempts %d", a)
	}
	clock.Advance(time.Second)
	fireDue(t, s)
	if a, _, failed, _ = attempts(bad); a != 3 || !failed {
		t.Fatalf("after 3 failures: attempts %d, failed %v; want kept as failed", a, failed)
	}
	clock.Advance(24 * time.Hour)
	fireDue(t, s)
	if a, _, _, _ = attempts(bad); a != 3 {
		t.Fatalf("a failed timer was retried: attempts %d", a)
	}

	list, err := s.Timers(ctx, 10)
	if err != nil || len(list) != 1 || list[0].ID != bad || !list[0].Failed() || list[0].Owner != "o" || list[0].Events != 1 || list[0].EventType != "x" {
		t.Fatalf("Timers = %+v, %v", list, err)
	}
	st, err := s.TimerStats(ctx)
	if err != nil || st.Pending != 0 || st.Failed != 1 || st.NextDue != nil {
		t.Fatalf("TimerStats = %+v, %v", st, err)
	}
	if ok, err := s.Cancel(ctx, nil, bad); err != nil || !ok {
		t.Fatalf("Cancel of a failed timer = %v, %v", ok, err)
	}
}
