package walsource_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/walsource"
)

// TestWakeAdvancesPastOtherTypes: a filtered subscriber woken by the WAL,
// while only events of other types are appended, is still woken now and
// then (WakeConfig.AdvanceAfter, 1 s by default), so its checkpoint moves
// past them and its slot's confirmed position follows, while the appends
// go on and long before its poll interval (a minute). Before, neither moved
// until the poll, and the slot retained all the WAL written meanwhile.
func TestWakeAdvancesPastOtherTypes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := annalstest.NewDB(t, nil)
	pool := db.Pool
	if _, err := pool.Exec(ctx, `CREATE TABLE applied (global_sequence bigint PRIMARY KEY, event_id uuid NOT NULL UNIQUE)`); err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	wake, err := walsource.NewWake(ctx, pool, &walsource.WakeConfig{StatusInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	slot := wake.Slot("applied", 0)
	dropSlotAtEnd(t, pool, slot)
	query := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	checkpoint := func() int64 {
		return query(`SELECT coalesce((SELECT position FROM annals.checkpoints WHERE subscriber_id = 'applied' AND partition = 0), 0)`)
	}
	head := func() int64 { return query(`SELECT coalesce(max(global_sequence), 0) FROM annals.events`) }
	walNow := func() string {
		var lsn string
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		return lsn
	}
	// confirmedPast reports whether the slot is confirmed through lsn.
	confirmedPast := func(lsn string) bool {
		return query(`SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn >= $2::pg_lsn`, slot, lsn) == 1
	}
	appendType := func(typ string) {
		if _, err := store.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: typ, Data: map[string]int{}}); err != nil {
			t.Error(err)
		}
	}

	runWoken(t, ctx, pool, wake, time.Minute, &projection.Options{Types: []string{"moved"}})
	annalstest.WaitFor(t, 30*time.Second, func() bool { return slotActive(ctx, pool, slot) })
	appendType("moved")
	annalstest.WaitFor(t, 20*time.Second, func() bool { return checkpoint() == 1 })

	// A writer appends other types, one every 50 ms, until told to stop.
	// (Paced, so that the engine catches up with it and goes idle: an
	// engine whose every read finds something new reads on without a
	// signal.)
	appendType("other")
	firstOther := head()
	stopWriter := make(chan struct{})
	var writer sync.WaitGroup
	writer.Add(1)
	go func() {
		defer writer.Done()
		pace := time.NewTicker(50 * time.Millisecond)
		defer pace.Stop()
		for {
			select {
			case <-stopWriter:
				return
			case <-pace.C:
				appendType("other")
			}
		}
	}()
	stopOnce := sync.OnceFunc(func() { close(stopWriter); writer.Wait() })
	defer stopOnce()
	// While it writes: the checkpoint passes what it wrote after half a
	// second, and the slot is confirmed past the WAL written by then.
	annalstest.WaitFor(t, 15*time.Second, func() bool { return head() >= firstOther+10 })
	target, lsn := head(), walNow()
	annalstest.WaitFor(t, 15*time.Second, func() bool { return checkpoint() >= target && confirmedPast(lsn) })
	stopOnce()
	// And once it stopped, both reach the end of what it wrote.
	last, end := head(), walNow()
	annalstest.WaitFor(t, 15*time.Second, func() bool { return checkpoint() == last && confirmedPast(end) })
	if n := query(`SELECT count(*) FROM applied`); n != 1 {
		t.Fatalf("%d events applied, want the one of the filter's type", n)
	}
}
