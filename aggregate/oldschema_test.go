package aggregate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/migrations"
)

// snapshotRows counts the snapshots of schema.
func snapshotRows(t *testing.T, db *annalstest.DB, schema string) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{schema}.Sanitize()+".snapshots").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A client of the current code deployed before `annals migrate` ran (a
// schema without the functions of migration 0034, snapshot_lock) writes its
// snapshots, taking Forget's lock with pg_try_advisory_xact_lock_shared
// on the key clients before 0034 took. Once advisory locks are restricted
// (which takes that function from the writer), a schema still without
// snapshot_lock fails the write with migrations.ErrNotMigrated (logged:
// the save stands); after 0034 is applied the same Repository writes its
// snapshots through snapshot_lock. Every snapshot write failed with 42883
// on a schema before 0034.
func TestSnapshotsOnOlderSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	cfg := &migrations.Config{Schema: `Snap "Old"`}
	// The schema as migrated through 0033: the functions 0034 adds are
	// dropped (UpWith, which stops at a version, is the migrations
	// package's own test hook); `annals migrate` runs 0034 below.
	if _, err := migrations.Up(ctx, db.Pool, cfg); err != nil {
		t.Fatal(err)
	}
	ms, err := migrations.All(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m0034 := ms[33]
	if m0034.Version != 34 || !strings.Contains(m0034.SQL, "snapshot_lock()") {
		t.Fatalf("migration 34 is %d %s, want the one adding snapshot_lock", m0034.Version, m0034.Name)
	}
	schema := pgx.Identifier{cfg.Schema}.Sanitize()
	if _, err := db.Pool.Exec(ctx, "DROP FUNCTION "+schema+".snapshot_lock(); DROP FUNCTION "+schema+".inline_stream_lock(text)"); err != nil {
		t.Fatal(err)
	}
	newRepo := func(pool *pgxpool.Pool, logs *annalstest.LogBuffer) *aggregate.Repository[*Account] {
		t.Helper()
		store, err := eventstore.New(pool, &eventstore.Config{Schema: cfg.Schema, Registry: registry()})
		if err != nil {
			t.Fatal(err)
		}
		r, err := aggregate.NewRepository(store, "account", newAccount, &aggregate.Config{
			Snapshots: &aggregate.SnapshotConfig{Every: 2, SchemaVersion: 1}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	save := func(r *aggregate.Repository[*Account], id string) {
		t.Helper()
		if _, err := r.Create(ctx, id, func(a *Account) error { return a.Open("ada") }); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Update(ctx, id, func(a *Account) error { return a.Deposit(1) }); err != nil {
			t.Fatal(err)
		}
	}

	var ownerLogs annalstest.LogBuffer
	save(newRepo(db.Pool, &ownerLogs), "owner")
	if n := snapshotRows(t, db, cfg.Schema); n != 1 {
		t.Fatalf("%d snapshots on a schema without snapshot_lock, want 1; log:\n%s", n, ownerLogs.String())
	}

	// A writer granted as `annals grant writer` did before 0034.
	var rb [6]byte
	_, _ = rand.Read(rb[:])
	w := "annals_agg_" + hex.EncodeToString(rb[:])
	if _, err := db.Pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{w}.Sanitize()+" LOGIN PASSWORD "+schemaname.Literal(w+"pw")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{w}.Sanitize())
		_, _ = db.Pool.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{w}.Sanitize())
	})
	stmts, err := migrations.GrantSQL(w, migrations.Writer, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stmts {
		if strings.Contains(s, ".inline_stream_lock(") || strings.Contains(s, ".snapshot_lock(") ||
			strings.Contains(s, ".append_events_json(") {
			continue
		}
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.User, pcfg.ConnConfig.Password = w, w+"pw"
	wp, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer wp.Close()
	var logs annalstest.LogBuffer
	r := newRepo(wp, &logs)
	save(r, "writer-before")
	if n := snapshotRows(t, db, cfg.Schema); n != 2 {
		t.Fatalf("%d snapshots after a writer's save on a schema without snapshot_lock, want 2; log:\n%s", n, logs.String())
	}

	if _, err := migrations.RestrictAdvisoryLocks(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	save(r, "writer-restricted")
	if n := snapshotRows(t, db, cfg.Schema); n != 2 {
		t.Fatalf("%d snapshots after a save that could take no lock, want 2", n)
	}
	if l := logs.String(); !strings.Contains(l, "writing a snapshot failed") || !strings.Contains(l, "annals migrate") {
		t.Fatalf("a snapshot write without snapshot_lock nor pg_try_advisory_xact_lock_shared logged:\n%s\nwant a failure saying to run annals migrate", l)
	}

	if _, err := db.Pool.Exec(ctx, m0034.SQL); err != nil {
		t.Fatal(err)
	}
	save(r, "writer-after")
	if n := snapshotRows(t, db, cfg.Schema); n != 3 {
		t.Fatalf("%d snapshots after migration 0034, want 3; log:\n%s", n, logs.String())
	}
}
