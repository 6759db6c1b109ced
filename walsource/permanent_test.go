package walsource_test

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/walsource"
)

// newRole creates a login role named prefix and the database's name, a
// member of the database's owner (whose privileges it inherits; the
// REPLICATION attribute is not inherited) with the given attribute
// (REPLICATION or NOREPLICATION), and drops it when the test ends, after
// whatever the test registers later.
func newRole(t *testing.T, db *annalstest.DB, prefix, attribute string) string {
	t.Helper()
	ctx := t.Context()
	role := prefix + strings.TrimPrefix(db.Name, "annalstest_")
	role = role[:min(len(role), 63)]
	var owner string
	if err := db.Pool.QueryRow(ctx, `SELECT current_user`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN "+attribute+" IN ROLE "+pgx.Identifier{owner}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Pool.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Error(err)
		}
	})
	return role
}

// poolAs returns a pool on the database at dbURL as role (closed when the
// test ends), and its URL.
func poolAs(t *testing.T, dbURL, role string) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	pool, err := pgxpool.New(t.Context(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// runUntilStopped runs src until it returns or within ends, and fails the
// test unless it returned a *PermanentError of code by itself.
func runUntilStopped(t *testing.T, src *walsource.Source, within time.Duration, code string) *walsource.PermanentError {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	err := src.Run(ctx)
	var pe *walsource.PermanentError
	if ctx.Err() != nil || !errors.As(err, &pe) {
		t.Fatalf("Run returned %v after %v (reconnects %d), want a *PermanentError at once", err, within, src.Reconnects())
	}
	if pe.Code != code {
		t.Fatalf("Run: SQLSTATE %s (%v), want %s", pe.Code, err, code)
	}
	if src.Reconnects() != 0 {
		t.Fatalf("the Source reconnected %d times on a permanent failure", src.Reconnects())
	}
	return pe
}

// checkOneError fails the test unless the log holds exactly one ERROR line,
// which names each of want, and no reconnect warning.
func checkOneError(t *testing.T, logs *logBuffer, want ...string) {
	t.Helper()
	out := logs.String()
	var errs []string
	for line := range strings.Lines(out) {
		if strings.Contains(line, "level=ERROR") {
			errs = append(errs, line)
		}
	}
	if len(errs) != 1 || strings.Contains(out, "reconnecting") {
		t.Fatalf("want one ERROR line and no reconnects, the log says:\n%s", out)
	}
	for _, w := range want {
		if !strings.Contains(errs[0], w) {
			t.Fatalf("the ERROR line lacks %q:\n%s", w, errs[0])
		}
	}
}

// A Source whose role lacks the REPLICATION attribute stops at once with a
// *PermanentError (42501), logging one ERROR that says how to mend it,
// whether PostgreSQL refuses it the slot's creation or, the slot made by
// another role, the replication connection. It reconnected with backoff
// for ever, logging a warning each time.
func TestSourceStopsWithoutReplication(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	if _, err := walsource.EnsurePublication(t.Context(), db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	role := newRole(t, db, "norepl_", "NOREPLICATION")
	pool := poolAs(t, db.URL, role)
	for _, tc := range []struct {
		name    string
		slotted bool // the slot exists: the replication connection is refused
	}{{"CreateSlot", false}, {"Connect", true}} {
		t.Run(tc.name, func(t *testing.T) {
			slot := walsource.SlotName(db.Name, db.Schema, "norepl"+tc.name, 0)
			if tc.slotted {
				dropSlotAtEnd(t, db.Pool, slot)
			}
			var logs logBuffer
			src, err := walsource.New(pool, &walsource.Config{Slot: slot, OnCommit: func(walsource.Commit) {},
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			pe := runUntilStopped(t, src, 20*time.Second, "42501")
			for _, w := range []string{"REPLICATION", role} {
				if !strings.Contains(pe.Error(), w) {
					t.Fatalf("the error lacks %q: %v", w, pe)
				}
			}
			checkOneError(t, &logs, `ALTER ROLE \"`+role+`\" REPLICATION`, "sqlstate=42501", slot)
		})
	}
}

// A Source on a server whose wal_level is replica stops at once with a
// *PermanentError saying so, and how to mend it. The creation of its slot
// failed with 55000 for ever. Private cluster: it has another wal_level.
func TestSourceStopsOnWALLevelReplica(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	_, pool := annalstest.PrivateCluster(t, ctx, &pgcluster.Options{Settings: map[string]string{"wal_level": "replica"}})
	var logs logBuffer
	src, err := walsource.New(pool, &walsource.Config{Slot: "annals_wal_level", OnCommit: func(walsource.Commit) {},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	pe := runUntilStopped(t, src, 20*time.Second, "55000")
	if !strings.Contains(pe.Problem, "wal_level is replica") {
		t.Fatalf("the error does not name wal_level: %v", pe)
	}
	checkOneError(t, &logs, "wal_level = logical", "restart")
}

// A database that does not exist is no reason to retry: the Source stops
// with 3D000.
func TestSourceStopsOnAMissingDatabase(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db.Name + "_missing"
	pool, err := pgxpool.New(t.Context(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var logs logBuffer
	src, err := walsource.New(pool, &walsource.Config{Slot: "annals_missing_db", OnCommit: func(walsource.Commit) {},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runUntilStopped(t, src, 20*time.Second, "3D000")
	checkOneError(t, &logs, "does not exist")
}

// A failure that may pass (here, a refused connection: no server on the
// port) is still retried, with backoff, until the context ends.
func TestSourceRetriesARefusedConnection(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://annals@127.0.0.1:1/annals?connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var logs logBuffer
	src, err := walsource.New(pool, &walsource.Config{Slot: "annals_refused", OnCommit: func(walsource.Commit) {},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned %v on a refused connection", err)
		default:
		}
		return src.Reconnects() >= 3
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v, want nil when its context ends", err)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("a refused connection logged an ERROR:\n%s", logs.String())
	}
}

// A subscriber woken by a Wake whose role lacks REPLICATION runs on
// polling: it applies every event, its Source stops after one ERROR (the
// leadership's Waker says so, and so does Wake.Err), and it neither
// retries nor spins meanwhile.
func TestWakeWithoutReplicationPolls(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	db := annalstest.NewDB(t, nil)
	if _, err := walsource.EnsurePublication(ctx, db.Pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE applied (global_sequence bigint PRIMARY KEY, event_id uuid NOT NULL UNIQUE)`); err != nil {
		t.Fatal(err)
	}
	role := newRole(t, db, "norepl_", "NOREPLICATION")
	pool := poolAs(t, db.URL, role)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	wake, err := walsource.NewWake(ctx, pool, &walsource.WakeConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}

	// The Waker of one leadership tells that its Source stopped, and why.
	w, stop := wake.For(ctx, &catchup.Subscription{Name: "direct"}, nil)
	sw, ok := w.(walsource.StoppingWaker)
	if !ok {
		stop()
		t.Fatalf("Wake.For's Waker %T is no StoppingWaker", w)
	}
	select {
	case <-sw.Stopped():
	case <-ctx.Done():
		stop()
		t.Fatalf("the Waker's Source has not stopped (log:\n%s)", logs.String())
	}
	stop()
	var pe *walsource.PermanentError
	if !errors.As(sw.Err(), &pe) || pe.Code != "42501" || !errors.As(wake.Err(), &pe) {
		t.Fatalf("Waker.Err %v, Wake.Err %v, want the *PermanentError 42501", sw.Err(), wake.Err())
	}
	select {
	case <-sw.Listening():
		t.Fatal("a stopped Waker says it listens")
	default:
	}
	checkOneError(t, &logs, "ALTER ROLE")

	// A runner: one more ERROR for its leadership, and polling.
	appendN(t, store, 0, 5)
	runWoken(t, ctx, pool, wake, 100*time.Millisecond, nil)
	applied := func() int64 {
		var n int64
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM applied`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool { return applied() == 5 })
	appendN(t, store, 5, 5)
	annalstest.WaitFor(t, 20*time.Second, func() bool { return applied() == 10 })
	if n := strings.Count(logs.String(), "level=ERROR"); n != 2 || strings.Contains(logs.String(), "reconnecting") {
		t.Fatalf("want one more ERROR for the runner's leadership, and no reconnects; the log says:\n%s", logs.String())
	}
}
