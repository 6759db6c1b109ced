package migrations_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/verify"
)

// A delete_stream call made while migration 0038's transaction is open runs
// the function as it was (PL/pgSQL takes the body when the call starts),
// waits for the migration at the append lock and commits after it: its
// deletion has no record although it lies above deletions_recorded_after().
// It was queued before any call that started after the upgrade, so it lies
// below the first deletion record: once a deletion is recorded, verify
// checks it as before (and lists it in a note). Until then it cannot be
// told from a state set by hand: verify reports it, saying so. (A review
// found verify reporting it for good.)
func TestDeletionWaitingForTheUpgrade(t *testing.T) {
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	cfg := upTo(t, db, `Waiting "0038"`, deletionsRecordedMigration)
	s := pgx.Identifier{cfg.Schema}.Sanitize()
	for _, id := range []string{"x", "y"} {
		if _, err := db.Pool.Exec(ctx, `SELECT * FROM `+s+`.append_one($1, NULL, gen_random_uuid(), 'T', '{}', NULL, true)`, id); err != nil {
			t.Fatal(err)
		}
	}
	// Hold a lock the migration transaction waits on after 0038 ran (the
	// stand-in for any later statement of a long upgrade).
	holder, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock(424242)`); err != nil {
		t.Fatal(err)
	}
	migDone := make(chan error, 1)
	go func() {
		_, err := migrations.UpWith(ctx, db.Pool, cfg, func(ms []migrations.Migration) []migrations.Migration {
			return append(ms, migrations.Migration{Version: 1038, Name: "hold", SQL: `SELECT pg_advisory_xact_lock(424242)`})
		})
		migDone <- err
	}()
	waitAdvisoryWaiters(t, db, 1) // the migration, past 0038, waits on 424242
	delDone := make(chan error, 1)
	go func() {
		_, err := db.Pool.Exec(ctx, `SELECT * FROM `+s+`.delete_stream('x', NULL, false)`)
		delDone <- err
	}()
	waitAdvisoryWaiters(t, db, 2) // and the deletion on the append lock
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock(424242)`); err != nil {
		t.Fatal(err)
	}
	if err := <-migDone; err != nil {
		t.Fatal(err)
	}
	if err := <-delDone; err != nil {
		t.Fatal(err)
	}
	var n int
	var recordedAfter, deletedAt int64
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+s+`.events WHERE stream_id = '$$x'), `+s+`.deletions_recorded_after(),
	        (SELECT global_sequence FROM `+s+`.events WHERE stream_id = 'x' AND event_type = '$stream.deleted')`).Scan(&n, &recordedAfter, &deletedAt); err != nil {
		t.Fatal(err)
	}
	if n != 0 || deletedAt <= recordedAfter {
		t.Fatalf("the deletion during the upgrade has %d records and lies at %d, deletions_recorded_after() is %d: want none above it (the old function)",
			n, deletedAt, recordedAfter)
	}

	check := func(when string, want int, note bool) {
		t.Helper()
		rep, err := verify.Log(ctx, db.Pool, &verify.Config{Schema: cfg.Schema})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Problems) != want {
			t.Errorf("%s: %d problems, want %d", when, len(rep.Problems), want)
		}
		for _, p := range rep.Problems {
			t.Logf("%s: %s: %s", when, p.Kind, p.Message)
			if p.Kind != verify.DeletionUnrecorded || p.StreamID != "x" || !strings.Contains(p.Message, "started while migration 0038 was applied") {
				t.Errorf("%s: %s %q: %s", when, p.Kind, p.StreamID, p.Message)
			}
		}
		found := false
		for _, m := range rep.Notes {
			t.Logf("%s: note: %s", when, m)
			found = found || strings.Contains(m, `["x"]`) && strings.Contains(m, "calls that started while migration 0038 was applied")
		}
		if found != note {
			t.Errorf("%s: a note on x: %v, want %v", when, found, note)
		}
	}
	// No deletion recorded yet: x cannot be told from a state set by hand.
	check("before any recorded deletion", 1, false)
	// A deletion after the upgrade is recorded, above x's.
	if _, err := db.Pool.Exec(ctx, `SELECT * FROM `+s+`.delete_stream('y', NULL, false)`); err != nil {
		t.Fatal(err)
	}
	check("after a recorded deletion", 0, true)
}

// waitAdvisoryWaiters waits until n advisory locks are awaited in db.
func waitAdvisoryWaiters(t *testing.T, db *annalstest.DB, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var k int
		if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND NOT l.granted
		    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&k); err != nil {
			t.Fatal(err)
		}
		if k >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("fewer than %d advisory-lock waiters", n)
}
