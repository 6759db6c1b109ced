package catchup_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
)

// Two engines, each with a pool of its own whose sessions default to
// REPEATABLE READ, record the layout of the same new subscriber at once
// (two runners starting together): both pass, and the layout is recorded
// once. The test holds the layouts table so that both statements are
// waiting when it lets them go. Before, the second one's statement kept the
// snapshot it took before the first one's insert, and its ON CONFLICT
// failed to serialize (40001): the runner did not start.
func TestCheckLayoutUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	db := annalstest.NewDB(t, nil)
	db.SetDefaultIsolation(t, "repeatable read")
	engines := make([]*catchup.Engine, 2)
	for i := range engines {
		var err error
		if engines[i], err = catchup.NewEngine(db.NewPool(t), nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	table := pgx.Identifier{db.Schema, "subscriber_layouts"}.Sanitize()
	hold, err := db.Pool.Begin(ctx) // db.Pool's sessions predate the ALTER: READ COMMITTED
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := hold.Exec(ctx, `LOCK TABLE `+table+` IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(engines))
	for i, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = e.CheckLayout(ctx, &catchup.Subscription{Name: "rr.orders", Partitions: 2})
		}()
	}
	// Both statements wait for the table: let them go together.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for waiting := 0; waiting < len(engines); {
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'relation' AND NOT granted AND relation = $1::regclass`, table).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= len(engines) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d engines waited for the layouts table: %v", waiting, len(engines), ctx.Err())
		case <-tick.C:
		}
	}
	if err := hold.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("engine %d: %v", i, err)
		}
	}
	var n, parts int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), max(partitions) FROM `+table+
		` WHERE subscriber_id = 'rr.orders'`).Scan(&n, &parts); err != nil || n != 1 || parts != 2 {
		t.Fatalf("recorded layouts = %d (partitions %d), %v; want one of 2 partitions", n, parts, err)
	}
}

// TestTakeOverClaimUnderRepeatableReadDefault: TakeOver, on an engine whose
// pool's sessions default to REPEATABLE READ, claims a checkpoint that a
// leader's commit holds for a moment (the test's update of the row): the
// claim waits for the commit and takes the partition. Before, the claim
// kept the snapshot it took before the wait and failed to serialize
// (40001) once the commit landed: "a checkpoint row held for a moment
// delays them, it does not fail them" held only under READ COMMITTED.
func TestTakeOverClaimUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	db := annalstest.NewDB(t, nil)
	sub := &catchup.Subscription{Name: "rr.takeover", Processor: nopProcessor{}}
	first, err := catchup.NewEngine(db.Pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.CatchUp(ctx, sub, 0); err != nil { // the checkpoint row
		t.Fatal(err)
	}
	db.SetDefaultIsolation(t, "repeatable read")
	e, err := catchup.NewEngine(db.NewPool(t), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{db.Schema, "checkpoints"}.Sanitize()
	hold, err := db.Pool.Begin(ctx) // db.Pool's sessions predate the ALTER: READ COMMITTED
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := hold.Exec(ctx, `UPDATE `+table+` SET updated_at = clock_timestamp() WHERE subscriber_id = 'rr.takeover'`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease *catchup.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		lease, err := e.TakeOver(ctx, sub, 30*time.Second)
		got <- result{lease, err}
	}()
	// The claim waits for the row: let the "commit" land.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for waiting := false; !waiting; {
		if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'
			  AND query LIKE '%checkpoints%' AND pid <> pg_backend_pid())`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-got:
			t.Fatalf("TakeOver returned before it waited for the row: %v, %v", r.lease, r.err)
		case <-ctx.Done():
			t.Fatal("TakeOver's claim did not wait for the checkpoint row")
		case <-tick.C:
		}
	}
	if err := hold.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("TakeOver: %v", r.err)
	}
	e.Release(ctx, r.lease)
}
