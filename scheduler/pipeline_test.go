package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/locktrace"
)

// A claim's timers are appended in due order, whatever order the database
// returns the claimed rows in: here they were stored latest-due first.
func TestClaimAppendsInDueOrder(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	s := newScheduler(t, db, &Config{Clock: clock})
	ctx := t.Context()
	const n = 6
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for k := n; k >= 1; k-- { // IDs (UUIDv7) and row order: latest due first
		if _, err := s.Schedule(ctx, tx, t0.Add(time.Duration(k)*time.Second), "ordered", ev("due", map[string]any{"k": k})); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute) // all due at once, in one claim
	if got := fireDue(t, s); got != n {
		t.Fatalf("fired %d, want %d", got, n)
	}
	rows, err := db.Pool.Query(ctx, `SELECT (data->>'k')::int FROM annals.events WHERE stream_id = 'ordered' ORDER BY stream_version`)
	if err != nil {
		t.Fatal(err)
	}
	var ks []int
	for rows.Next() {
		var k int
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		ks = append(ks, k)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ks) != "[1 2 3 4 5 6]" {
		t.Fatalf("appended in order %v (by due second); want [1 2 3 4 5 6]", ks)
	}
}

// No claim makes a round trip while it holds the log's append lock: a batch
// claim, the one-by-one fallback after a failing timer, and a cron tick all
// send their appends together with the COMMIT. The one exception is the
// ROLLBACK after a pipeline whose append failed: the failed transaction
// keeps the lock until that round trip ends it.
func TestClaimsSendNoRoundTripUnderTheAppendLock(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	tr := locktrace.New()
	s := newTracedScheduler(t, db, &Config{Clock: clock, MaxAttempts: 2}, tr)
	ctx := t.Context()
	e := ev("x", map[string]any{})

	// A clean batch.
	for i := range 20 {
		if _, err := s.Schedule(ctx, nil, t0, fmt.Sprintf("clean-%d", i%4), e); err != nil {
			t.Fatal(err)
		}
	}
	if got := fireDue(t, s); got != 20 {
		t.Fatalf("clean batch fired %d, want 20", got)
	}
	if under, total := tr.Counts(); under != 0 {
		t.Fatalf("clean batch: %d of %d round trips under the append lock", under, total)
	}

	// A batch with a failing timer: it is rolled back and fired one by one.
	bad, err := s.ScheduleTimer(ctx, nil, Timer{At: t0, StreamID: "bad", Expected: eventstore.Exact(9), Events: []eventstore.EventData{e}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := s.Schedule(ctx, nil, t0, fmt.Sprintf("good-%d", i), e); err != nil {
			t.Fatal(err)
		}
	}
	if got := fireDue(t, s); got != 5 {
		t.Fatalf("batch with a failing timer fired %d, want the 5 good ones", got)
	}
	if a := count(t, db, `SELECT attempts FROM annals.timers WHERE id = $1`, bad); a != 1 {
		t.Fatalf("the failing timer has %d attempts recorded, want 1", a)
	}
	clock.Advance(time.Second)
	fireDue(t, s)
	if f := count(t, db, `SELECT count(*) FROM annals.timers WHERE id = $1 AND failed_at IS NOT NULL AND attempts = 2`, bad); f != 1 {
		t.Fatal("the failing timer was not kept as failed after MaxAttempts")
	}

	// A cron tick.
	if err := s.AddTask(ctx, Task{Name: "every", Spec: "@every 1m", StreamID: "ticks"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if _, err := s.FireDue(ctx); err != nil {
		t.Fatal(err)
	}
	if eventsIn(t, db, "ticks") != 1 {
		t.Fatal("the cron tick did not fire")
	}

	under, total := tr.Counts()
	rb := tr.RollbacksUnderLock()
	t.Logf("%d round trips, %d under the append lock, and %d ROLLBACKs after failed appends", total, under, rb)
	if under != 0 {
		t.Fatalf("%d of %d round trips were sent while a claim held the log's append lock; want 0", under, total)
	}
	// The failing timer's two attempts: each a failed batch (it was due with
	// others, then alone) and a failed one-by-one retry.
	if rb != 4 {
		t.Fatalf("%d ROLLBACKs after a failed append; want 4", rb)
	}
}
