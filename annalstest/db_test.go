package annalstest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// adminPool returns the harness's connection to the admin database.
func adminPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	srv, err := getServer()
	if err != nil {
		t.Fatal(err)
	}
	return srv.admin
}

func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	var ok bool
	if err := adminPool(t).QueryRow(context.Background(), queries()["DatabaseExists"], name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// appendOne appends one event to stream through the schema's SQL function and
// returns its global sequence.
func appendOne(t *testing.T, db *DB, stream string) int64 {
	t.Helper()
	fn := pgx.Identifier{db.Schema, "append_events"}.Sanitize()
	var seq int64
	err := db.Pool.QueryRow(t.Context(),
		fmt.Sprintf(`SELECT global_sequence FROM %s($1, 0, '[{"type": "Tested", "data": {}}]')`, fn),
		stream).Scan(&seq)
	if err != nil {
		t.Fatalf("append_events in schema %q: %v", db.Schema, err)
	}
	return seq
}

func streams(t *testing.T, db *DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(),
		fmt.Sprintf("SELECT stream_id FROM %s ORDER BY 1", pgx.Identifier{db.Schema, "events"}.Sanitize()))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestNewDBParallelAndIsolated(t *testing.T) {
	t.Parallel()
	const n = 8
	var mu sync.Mutex
	names := map[string]bool{}
	t.Run("Group", func(t *testing.T) {
		for i := range n {
			t.Run(fmt.Sprintf("DB%d", i), func(t *testing.T) {
				t.Parallel()
				db := NewDB(t, nil)
				mu.Lock()
				names[db.Name] = true
				mu.Unlock()
				if db.Schema != "annals" {
					t.Errorf("Schema = %q, want annals", db.Schema)
				}
				var current string
				if err := db.Pool.QueryRow(t.Context(), "SELECT current_database()").Scan(&current); err != nil || current != db.Name {
					t.Fatalf("current_database() = %q, %v; want %q", current, err, db.Name)
				}
				var table *string
				if err := db.Pool.QueryRow(t.Context(), "SELECT to_regclass('annals.events')::text").Scan(&table); err != nil || table == nil {
					t.Fatalf("annals.events does not exist: %v", err)
				}
				stream := fmt.Sprintf("stream-%d", i)
				if seq := appendOne(t, db, stream); seq != 1 {
					t.Errorf("first append got global_sequence %d, want 1 in a fresh database", seq)
				}
				if got := streams(t, db); len(got) != 1 || got[0] != stream {
					t.Errorf("events in this database = %v, want only %s", got, stream)
				}
			})
		}
	})
	if len(names) != n {
		t.Fatalf("%d distinct database names for %d tests: %v", len(names), n, names)
	}
	for name := range names {
		if databaseExists(t, name) {
			t.Errorf("database %s still exists after its test ended", name)
		}
	}
}

func TestNewDBQuotedSchema(t *testing.T) {
	t.Parallel()
	const schema = `My "Schema"`
	db := NewDB(t, &Options{Schema: schema})
	if db.Schema != schema {
		t.Errorf("Schema = %q, want %q", db.Schema, schema)
	}
	if seq := appendOne(t, db, "quoted"); seq != 1 {
		t.Errorf("global_sequence = %d, want 1", seq)
	}
	var exists bool
	if err := db.Pool.QueryRow(t.Context(), "SELECT to_regclass('annals.events') IS NOT NULL").Scan(&exists); err != nil || exists {
		t.Errorf("the default schema exists too (%v, %v); only %q should", exists, err, schema)
	}
}

func TestNewDBPoolConfig(t *testing.T) {
	t.Parallel()
	db := NewDB(t, &Options{PoolConfig: func(c *pgxpool.Config) {
		c.MaxConns = 2
		c.ConnConfig.RuntimeParams["application_name"] = "annalstest-hook"
	}})
	if got := db.Pool.Config().MaxConns; got != 2 {
		t.Errorf("MaxConns = %d, want 2", got)
	}
	var app string
	if err := db.Pool.QueryRow(t.Context(), "SHOW application_name").Scan(&app); err != nil || app != "annalstest-hook" {
		t.Errorf("application_name = %q, %v", app, err)
	}
	if !strings.Contains(db.URL, db.Name) {
		t.Errorf("URL %s does not name the database %s", db.URL, db.Name)
	}
}

func TestNewDBCleanupDropsDatabase(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("Test", func(t *testing.T) {
		db := NewDB(t, nil)
		name = db.Name
		// A connection the test leaks must not keep the database alive.
		conn, err := pgx.Connect(t.Context(), db.URL)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn // deliberately not closed
		if !databaseExists(t, name) {
			t.Fatalf("database %s does not exist during its test", name)
		}
	})
	if databaseExists(t, name) {
		t.Fatalf("database %s still exists after its test ended", name)
	}
}

func TestNewDBRejectsBadSchema(t *testing.T) {
	t.Parallel()
	ft := &fakeTB{}
	runFake(ft, func() { NewDB(ft, &Options{Schema: "a$b"}) })
	if len(ft.fatals) != 1 || !strings.Contains(ft.fatals[0], "invalid schema name") {
		t.Fatalf("fatals = %q, want one about the invalid schema name", ft.fatals)
	}
}

func TestNewDBName(t *testing.T) {
	t.Parallel()
	a := newDBName("TestSomething/Sub_Case#01 with a very long name that goes on and on")
	b := newDBName("TestSomething/Sub_Case#01 with a very long name that goes on and on")
	if a == b {
		t.Errorf("two names are equal: %s", a)
	}
	if len(a) > 63 || !strings.HasPrefix(a, "annalstest_testsomething_sub_case_0_") {
		t.Errorf("newDBName = %s (%d bytes)", a, len(a))
	}
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:p@h:5/postgres?sslmode=disable", "postgres://u:p@h:5/x?sslmode=disable"},
		{"postgresql://h/", "postgresql://h/x"},
		{"postgres://h/db?dbname=db", "postgres://h/x?dbname=x"},
		{"host=h user=u dbname=postgres", "host=h user=u dbname=postgres dbname=x"},
	} {
		if got := withDatabase(tc.in, "x"); got != tc.want {
			t.Errorf("withDatabase(%q) = %q, want %q", tc.in, got, tc.want)
		}
		cfg, err := pgxpool.ParseConfig(withDatabase(tc.in, "x"))
		if err != nil || cfg.ConnConfig.Database != "x" {
			t.Errorf("withDatabase(%q) does not parse to database x: %v", tc.in, err)
		}
	}
}

func TestQueries(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"ServerVersion", "DatabaseExists", "LockTemplate", "DropDatabase",
		"CreateEmptyDatabase", "SealTemplate", "PublishTemplate", "CloneTemplate"} {
		if queries()[name] == "" {
			t.Errorf("database.sql has no query %s", name)
		}
	}
	if got, want := bind("CloneTemplate", `a"b`, "t"), `CREATE DATABASE "a""b" TEMPLATE "t";`; got != want {
		t.Errorf("bind = %s, want %s", got, want)
	}
}

// cleanupTB is a testing.TB for NewDB that records errors and keeps the
// cleanups for the test to run.
type cleanupTB struct {
	testing.TB
	ctx      context.Context
	errors   []string
	cleanups []func()
}

func (f *cleanupTB) Helper()                  {}
func (f *cleanupTB) Name() string             { return "TestCleanupTB" }
func (f *cleanupTB) Context() context.Context { return f.ctx }
func (f *cleanupTB) Cleanup(fn func())        { f.cleanups = append(f.cleanups, fn) }
func (f *cleanupTB) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}
func (f *cleanupTB) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("Fatalf: "+format, args...))
}

func (f *cleanupTB) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func TestNewDBLeakedTransaction(t *testing.T) {
	// Not parallel: it lowers leakGrace.
	defer func(g time.Duration) { leakGrace = g }(leakGrace)
	leakGrace = 200 * time.Millisecond

	ft := &cleanupTB{ctx: t.Context()}
	db := NewDB(ft, nil)
	tx, err := db.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// tx is leaked: neither committed nor rolled back before the test ends.

	done := make(chan struct{})
	go func() {
		ft.runCleanups()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the cleanup of a test that leaked a transaction did not end within 30s")
	}
	if len(ft.errors) != 1 || !strings.Contains(ft.errors[0], "1 connection(s)") ||
		!strings.Contains(ft.errors[0], "still acquired") {
		t.Errorf("errors = %q, want one reporting 1 leaked connection", ft.errors)
	}
	if databaseExists(t, db.Name) {
		t.Errorf("database %s still exists after the cleanup", db.Name)
	}
	// The drop ended the leaked session; releasing it lets the pool finish closing.
	_ = tx.Rollback(context.Background())
}
