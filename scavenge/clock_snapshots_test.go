package scavenge_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/scavenge"
	"github.com/annals-dev/annals/verify"
)

// asOperator creates a role with `annals grant operator` and returns a
// function that runs fn in a transaction of db's pool with that role set:
// the privileges checked are the operator's.
func asOperator(t *testing.T, db *annalstest.DB) func(fn func(tx pgx.Tx) error) error {
	t.Helper()
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "annals_operator_" + hex.EncodeToString(b[:])
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := db.Pool.Exec(ctx, "CREATE ROLE "+ident+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Revoking takes turns with Grant (its advisory lock): concurrent
		// changes of one object's privileges fail.
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			k1, k2 := lockkey.Pair(db.Schema + ":grant")
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", k1, k2); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DROP OWNED BY "+ident)
			return err
		})
		if err != nil {
			t.Errorf("drop owned by %s: %v", name, err)
		}
		if _, err := db.Pool.Exec(ctx, "DROP ROLE "+ident); err != nil {
			t.Errorf("drop role %s: %v", name, err)
		}
	})
	if err := migrations.Grant(ctx, db.Pool, name, migrations.Operator, &migrations.Config{Schema: db.Schema}); err != nil {
		t.Fatal(err)
	}
	return func(fn func(tx pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+ident); err != nil {
				return err
			}
			return fn(tx)
		})
	}
}

// A run's retention clock is never later than the server's (migration
// 0027): an operator who passes a time in the future removes no event its
// stream's maximum age keeps. An earlier time is used as given.
func TestScavengeClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := store.Append(ctx, "recent", eventstore.Any, ev()); err != nil {
			t.Fatal(err)
		}
	}
	month := 30 * 24 * time.Hour
	if _, err := store.SetStreamRetention(ctx, "recent", eventstore.RetentionChange{MaxAge: &month}); err != nil {
		t.Fatal(err)
	}
	left := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.events WHERE stream_id = 'recent'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The audit's call, as an operator: the year 3000.
	var removed int64
	var startedAt, now time.Time
	err = asOperator(t, db)(func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT removed, started_at, now_at FROM annals.scavenge('x', '3000-01-01', 10000)`).Scan(&removed, &startedAt, &now)
	})
	if err != nil {
		t.Fatal(err)
	}
	if removed != 0 || left() != 3 || !now.Equal(startedAt) || time.Since(now) > time.Minute {
		t.Fatalf("a run with the clock in the year 3000: removed %d, %d events left, started %v, clock %v; want nothing removed and the server's clock",
			removed, left(), startedAt, now)
	}

	// scavenge.Config.Clock ahead: clamped too.
	s, err := scavenge.New(db.Pool, &scavenge.Config{Pause: -1, Clock: func() time.Time { return time.Now().Add(2 * month) }})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.RunOnce(ctx)
	if err != nil || p.Removed != 0 || left() != 3 || p.Now.After(p.StartedAt) {
		t.Fatalf("a run with Clock two months ahead: %+v %v, %d left", p, err, left())
	}

	// An earlier clock is the caller's to choose (it removes less).
	past := time.Now().Add(-24 * time.Hour).Truncate(time.Microsecond)
	s, err = scavenge.New(db.Pool, &scavenge.Config{Pause: -1, Clock: func() time.Time { return past }})
	if err != nil {
		t.Fatal(err)
	}
	if p, err = s.RunOnce(ctx); err != nil || !p.Now.Equal(past) {
		t.Fatalf("a run with the clock a day behind: %+v %v, want clock %v", p, err, past)
	}
	rep, err := verify.Log(ctx, db.Pool, nil)
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

// A scavenge step deletes the snapshots built from the events it removes:
// at or below the highest version it removed of a stream, those whose state
// folds the stream from a version at or below it (first_version; from 1
// for a row older code wrote), and every one of a hard-deleted stream
// (migration 0027). The operator's EXECUTE on scavenge() is enough: the
// function deletes them as the schema's owner.
func TestScavengeSnapshots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	add := func(stream string, n int) {
		for range n {
			if _, err := store.Append(ctx, stream, eventstore.Any, ev()); err != nil {
				t.Fatal(err)
			}
		}
	}
	// snap writes a snapshot as older code did (first and checked versions
	// NULL: it folds the stream from version 1).
	snap := func(typ, stream string, version int64) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `INSERT INTO annals.snapshots (aggregate_type, stream_id, schema_version, stream_version, state)
			VALUES ($1, $2, 1, $3, '{"secret": "plaintext"}')`, typ, stream, version); err != nil {
			t.Fatal(err)
		}
	}
	// folds writes one as SaveSnapshot does: it folds the stream from
	// version first, checked at its version (checked: checked_version is
	// the stream version; otherwise older code overwrote it, and it folds
	// from 1 again).
	folds := func(typ, stream string, version, first int64, checked bool) {
		t.Helper()
		cv := version
		if !checked {
			cv = first
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO annals.snapshots (aggregate_type, stream_id, schema_version, stream_version, state,
				first_version, checked_version)
			VALUES ($1, $2, 1, $3, '{"secret": "plaintext"}', $4, $5)`, typ, stream, version, first, cv); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // interleaved, so that a batch holds several streams
		for _, s := range []string{"hard", "soft", "trunc", "count", "live"} {
			add(s, 2)
		}
	}
	snap("A", "hard", 2)
	snap("B", "hard", 4)
	snap("A", "soft", 3)
	snap("A", "trunc", 2)
	snap("B", "trunc", 3)
	folds("C", "trunc", 4, 3, true)
	folds("D", "trunc", 4, 1, true)
	folds("E", "trunc", 4, 3, false)
	snap("A", "count", 1)
	folds("B", "count", 3, 3, true)
	folds("C", "count", 4, 1, true)
	snap("A", "live", 4)
	if _, err := store.DeleteStream(ctx, "hard", eventstore.Any, &eventstore.DeleteOptions{Hard: true}); err != nil {
		t.Fatal(err)
	}
	res, err := store.DeleteStream(ctx, "soft", eventstore.Any, nil) // soft-5
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "soft", eventstore.Exact(res.StreamVersion), ev()); err != nil { // soft-6
		t.Fatal(err)
	}
	snap("B", "soft", 6)
	folds("C", "soft", 6, 6, true)
	three, two := int64(3), int64(2)
	if _, err := store.SetStreamRetention(ctx, "trunc", eventstore.RetentionChange{TruncateBefore: &three}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.SetStreamRetention(ctx, "count", eventstore.RetentionChange{MaxCount: &two}); err != nil {
		t.Fatal(err)
	}

	run := asOperator(t, db)
	for done := false; !done; {
		if err := run(func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT done FROM annals.scavenge('x', NULL, 7)`).Scan(&done)
		}); err != nil {
			t.Fatalf("scavenge as an operator: %v", err)
		}
	}
	rows, err := db.Pool.Query(ctx, `SELECT stream_id || '/' || aggregate_type || '@' || stream_version FROM annals.snapshots ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	// hard: every snapshot. soft: versions 1 to 5 removed (the deletion
	// is 5), so the one at 3 and B at 6, which older code wrote (it folds
	// from 1); C folds 6 alone. trunc: versions 1, 2 removed, so the one at
	// 2, B (older code), D (folds from 1) and E (first version 3, but
	// overwritten by older code: from 1); C folds 3 and 4. count: versions
	// 1, 2 removed (4 - 2), so the one at 1 and C (folds from 1); B folds 3.
	if want := []string{"count/B@3", "live/A@4", "soft/C@6", "trunc/C@4"}; !slices.Equal(got, want) {
		t.Fatalf("snapshots after scavenging: %v, want %v", got, want)
	}
}

// Migration 0026 deletes the snapshots of events scavenged before it: the
// rows (all written by older code, folding their stream from version 1) of
// streams that lost their first version or the row's own. Its ALTER TABLE,
// whose ACCESS EXCLUSIVE lock makes loads wait until the whole upgrade
// commits, comes after the statements that read the table, and reads
// nothing itself (the new columns' CHECK is added NOT VALID).
func TestScavengeSnapshotsUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	const schema = "upgraded"
	all, err := migrations.All(&migrations.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(all, func(m migrations.Migration) bool { return m.Name == "snapshot_folds" })
	if i < 0 {
		t.Fatal("no migration snapshot_folds")
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE SCHEMA " + schema)
	for _, m := range all[:i] {
		exec(m.SQL)
	}
	for _, s := range []string{"gone", "kept", "gone", "kept", "kept", "whole", "whole"} {
		exec(`SELECT * FROM upgraded.append_events($1, NULL, '[{"type":"t","data":{}}]')`, s)
	}
	exec(`SELECT * FROM upgraded.delete_stream('gone', -1, true, NULL)`)
	exec(`SELECT * FROM upgraded.set_stream_retention('kept', NULL, NULL, 3)`)
	for _, v := range []struct {
		stream  string
		version int
	}{{"gone", 2}, {"kept", 2}, {"kept", 3}, {"whole", 2}} {
		exec(fmt.Sprintf(`INSERT INTO upgraded.snapshots (aggregate_type, stream_id, schema_version, stream_version, state)
			VALUES ('A%d', $1, 1, $2, '{}')`, v.version), v.stream, v.version)
	}
	exec(`SELECT * FROM upgraded.scavenge('x', NULL, 1000)`)

	// The migration, in the transaction Up would run it in: what comes
	// from the ALTER TABLE on scans snapshots no more.
	sql := all[i].SQL
	at := strings.Index(sql, "\nALTER TABLE "+pgx.Identifier{schema}.Sanitize()+".snapshots")
	if at < 0 {
		t.Fatalf("migration %04d alters no snapshots table", all[i].Version)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		scans := func() (n int64) {
			t.Helper()
			if err := tx.QueryRow(ctx, `SELECT seq_scan FROM pg_stat_xact_user_tables
				WHERE schemaname = $1 AND relname = 'snapshots'`, schema).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		if _, err := tx.Exec(ctx, sql[:at]); err != nil {
			return err
		}
		before := scans()
		if _, err := tx.Exec(ctx, sql[at:]); err != nil {
			return err
		}
		if after := scans(); after != before || before == 0 {
			t.Errorf("snapshots scanned %d times before the ALTER TABLE and %d after it; want the scans before it only", before, after-before)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	rows, err := db.Pool.Query(ctx, `SELECT stream_id || '@' || stream_version FROM upgraded.snapshots ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	// gone: hard-deleted, every event removed; kept: versions 1 and 2
	// removed (the row at 3 folds them too).
	if got, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || !slices.Equal(got, []string{"whole@2"}) {
		t.Fatalf("snapshots after the upgrade: %v %v, want whole@2 only", got, err)
	}
	// The CHECK added NOT VALID holds for new rows.
	_, err = db.Pool.Exec(ctx, `INSERT INTO upgraded.snapshots (aggregate_type, stream_id, schema_version, stream_version, state, first_version)
		VALUES ('B', 'whole', 1, 2, '{}', 0)`)
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "23514" {
		t.Fatalf("a snapshot with first version 0: %v, want a check violation (23514)", err)
	}
}
