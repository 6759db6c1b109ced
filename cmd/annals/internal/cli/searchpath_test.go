package cli

import (
	"bytes"
	"context"
	"io"
	"net/url"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/pgcluster"
)

// TestConnectPinsTheSearchPath: the CLI's sessions run with the search_path
// pinned to pg_catalog, pg_temp (an operator, often the schema's owner or a
// superuser, runs verify, status, scavenge, the console, whose unqualified
// functions and operators must not resolve to objects another role
// planted in public), unless the URL sets one (search_path=, or -c
// search_path in options); behind PgBouncer in
// transaction mode, which refuses search_path at start-up, the command
// connects without it and says so; annals bench keeps the URL's.
func TestConnectPinsTheSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	pathOf := func(u string, pin bool) (string, string) {
		t.Helper()
		var stderr bytes.Buffer
		e := &env{stderr: &stderr, getenv: func(string) string { return "" }, databaseURL: u, schema: "annals"}
		open := e.connect
		if !pin {
			open = e.connectUnpinned
		}
		pool, err := open(ctx)
		if err != nil {
			t.Fatalf("connect %s: %v", u, err)
		}
		defer pool.Close()
		var path string
		if err := pool.QueryRow(ctx, "SELECT current_setting('search_path')").Scan(&path); err != nil {
			t.Fatal(err)
		}
		return path, stderr.String()
	}
	if path, note := pathOf(db.URL, true); path != pinnedSearchPath || note != "" {
		t.Errorf("connect: search_path %q, note %q; want %q and none", path, note, pinnedSearchPath)
	}
	// annals tail --read-url's replica pool is pinned too.
	replica, err := (&env{stderr: io.Discard}).openURL(ctx, db.URL, true)
	if err != nil {
		t.Fatal(err)
	}
	var rpath string
	err = replica.QueryRow(ctx, "SELECT current_setting('search_path')").Scan(&rpath)
	replica.Close()
	if err != nil || rpath != pinnedSearchPath {
		t.Errorf("a --read-url pool: search_path %q (%v), want %q", rpath, err, pinnedSearchPath)
	}
	if path, _ := pathOf(db.URL, false); path == pinnedSearchPath {
		t.Errorf("connectUnpinned: search_path %q, want the server's default", path)
	}
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", "mine")
	u.RawQuery = q.Encode()
	if path, _ := pathOf(u.String(), true); path != "mine" {
		t.Errorf("connect with search_path in the URL: %q, want the URL's", path)
	}
	// The libpq way, in options (a URL's, or PGOPTIONS): the server applies
	// options before the other start-up parameters, so a pinned
	// search_path beside it would win. Before, it did.
	q = u.Query()
	q.Del("search_path")
	q.Set("options", "-c search_path=mine")
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx reads no + as a space
	if path, _ := pathOf(u.String(), true); path != "mine" {
		t.Errorf("connect with -c search_path in the URL's options: %q, want the URL's", path)
	}
	pooled, _ := annalstest.PgBouncer(t, db.URL, nil)
	path, note := pathOf(pooled, true)
	if path == pinnedSearchPath || !strings.Contains(note, "track_extra_parameters") {
		t.Errorf("through PgBouncer: search_path %q, note %q; want the default and a note", path, note)
	}
	// Told to ignore it, PgBouncer drops it without a word: the command
	// reads the path it got, and says so.
	ignoring, _ := annalstest.PgBouncer(t, db.URL, &pgcluster.PgBouncerOptions{IgnoreStartupParameters: []string{"search_path"}})
	path, note = pathOf(ignoring, true)
	if path == pinnedSearchPath || !strings.Contains(note, "ignore_startup_parameters") {
		t.Errorf("through a PgBouncer that ignores search_path: search_path %q, note %q; want the default and a note", path, note)
	}
}

// TestConnectThroughATransactionPooler: several commands' sessions through
// a PgBouncer in transaction mode without prepared-statement support (the
// default before 1.21) share its two server sessions; the CLI prepares no
// statement by name there (pgx's default cache did: "prepared statement
// stmtcache_... already exists", 42P05, or "does not exist", 26000).
func TestConnectThroughATransactionPooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	pooled, _ := annalstest.PgBouncer(t, db.URL, nil)
	for i := range 4 {
		e := &env{stderr: io.Discard, getenv: func(string) string { return "" }, databaseURL: pooled, schema: "annals"}
		pool, err := e.connect(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		for j := range 6 {
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM annals.events WHERE global_sequence > $1", j).Scan(&n); err != nil {
				pool.Close()
				t.Fatalf("command %d, statement %d: %v", i, j, err)
			}
		}
		pool.Close()
	}
}
