package scavenge_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// A scavenge step and forget_subject take turns (migration 0027): both
// delete snapshots and touch personal_streams, each in an order of its own,
// so a step holds the advisory lock <schema>:forget shared, waiting for
// it, and a Forget holds it exclusively. A step waits for a Forget in
// progress, and a Forget for a step in progress, instead of the two
// deadlocking. The Forget and the step here share no row: only the lock
// can make one wait for the other.
func TestScavengeTakesTurnsWithForget(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Each round removes one event of its own stream.
	round := func(stream string) {
		t.Helper()
		for range 2 {
			if _, err := store.Append(ctx, stream, eventstore.Any, ev()); err != nil {
				t.Fatal(err)
			}
		}
		two := int64(2)
		if _, err := store.SetStreamRetention(ctx, stream, eventstore.RetentionChange{TruncateBefore: &two}); err != nil {
			t.Fatal(err)
		}
	}
	left := func(stream string) (n int) {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.events WHERE stream_id = $1`, stream).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// waiting reports whether a backend other than ours waits for an
	// advisory lock, polling for up to a few seconds until it does.
	waiting := func() bool {
		t.Helper()
		for range 100 {
			var n int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				return true
			}
			time.Sleep(30 * time.Millisecond)
		}
		return false
	}
	// hold runs sql in a transaction of its own and keeps it open until
	// release is called, which commits it.
	hold := func(sql string) (release func()) {
		t.Helper()
		tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, sql)
		if err == nil {
			for rows.Next() {
			}
			rows.Close()
			err = rows.Err()
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			t.Fatalf("%s: %v", sql, err)
		}
		return func() {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	step := func() error {
		for {
			var done bool
			if err := db.Pool.QueryRow(ctx, `SELECT done FROM annals.scavenge('x', NULL, 1000)`).Scan(&done); err != nil || done {
				return err
			}
		}
	}

	// A Forget in progress: a step waits for it.
	round("first")
	release := hold(`SELECT * FROM annals.forget_subject('c-7')`)
	stepped := make(chan error, 1)
	go func() { stepped <- step() }()
	if !waiting() {
		release()
		t.Fatalf("a scavenge step did not wait for a Forget in progress (step: %v)", <-stepped)
	}
	select {
	case err := <-stepped:
		release()
		t.Fatalf("a scavenge step finished while a Forget was in progress: %v", err)
	default:
	}
	release()
	if err := <-stepped; err != nil || left("first") != 1 {
		t.Fatalf("the step after the Forget: %v, %d events of the stream left; want 1", err, left("first"))
	}

	// A step in progress: a Forget waits for it.
	round("second")
	release = hold(`SELECT * FROM annals.scavenge('x', NULL, 1000)`)
	// A snapshot write (aggregate's SnapshotLock) does not wait for it.
	var locked bool
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock_shared(hashtextextended('annals' || ':forget', 0))`).Scan(&locked)
	})
	if err != nil || !locked {
		release()
		t.Fatalf("a snapshot write's lock during a scavenge step: %v %v; want it granted", locked, err)
	}
	forgot := make(chan error, 1)
	go func() {
		_, err := store.Forget(ctx, "c-8")
		forgot <- err
	}()
	if !waiting() {
		release()
		t.Fatalf("a Forget did not wait for a scavenge step in progress (Forget: %v)", <-forgot)
	}
	release()
	if err := <-forgot; err != nil {
		t.Fatalf("Forget after the step: %v", err)
	}
	if err := step(); err != nil || left("second") != 1 {
		t.Fatalf("the rest of the run: %v, %d events of the stream left; want 1", err, left("second"))
	}
}
