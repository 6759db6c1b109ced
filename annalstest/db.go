package annalstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/schemaname"
)

// Options configures [NewDB]. A nil *Options means defaults.
type Options struct {
	// Schema is the annals schema migrated into the database.
	// Defaults to "annals".
	Schema string
	// PoolConfig, when set, may change the pool's configuration (MaxConns,
	// AfterConnect, tracers, ...) before the pool is created.
	// Defaults to nil: pgxpool's defaults.
	PoolConfig func(*pgxpool.Config)
}

// DB is a fresh, migrated database for one test.
type DB struct {
	// URL connects to the database, with the admin URL's user, host and
	// parameters.
	URL string
	// Name is the database name.
	Name string
	// Schema is the annals schema in it.
	Schema string
	// Pool is connected to the database and closed when the test ends.
	Pool *pgxpool.Pool
}

const (
	dbPrefix   = "annalstest_"
	setupFor   = 5 * time.Minute // bounds template creation and cloning
	cleanupFor = time.Minute
)

// NewDB returns a new database for the test t, with the annals migrations
// applied. It is cloned from a template database (CREATE DATABASE ...
// TEMPLATE), built once per server for each schema name and set of
// migrations, so it costs a file copy rather than a migration run. When the
// test ends the pool is closed and the database dropped.
//
// The first call in a test binary chooses the server (see the package
// documentation); if there is none, NewDB fails the test with instructions.
func NewDB(t testing.TB, opts *Options) *DB {
	t.Helper()
	var o Options
	if opts != nil {
		o = *opts
	}
	var err error
	if o.Schema, err = schemaname.Resolve(o.Schema); err != nil {
		t.Fatalf("annalstest: %v", err)
	}
	srv, err := getServer()
	if err != nil {
		t.Fatalf("%v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), setupFor)
	defer cancel()
	tpl, err := srv.template(ctx, o.Schema)
	if err != nil {
		t.Fatalf("%v", err)
	}

	name := newDBName(t.Name())
	if _, err := srv.admin.Exec(ctx, bind("CloneTemplate", name, tpl)); err != nil {
		t.Fatalf("annalstest: create database %s from %s: %v", name, tpl, err)
	}
	t.Cleanup(func() {
		// t.Context() is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), cleanupFor)
		defer cancel()
		if _, err := srv.admin.Exec(ctx, bind("DropDatabase", name, "")); err != nil {
			t.Errorf("annalstest: drop database %s: %v", name, err)
		}
	})

	db := &DB{URL: withDatabase(srv.adminURL, name), Name: name, Schema: o.Schema}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatalf("annalstest: parse %s: %v", db.URL, err)
	}
	if o.PoolConfig != nil {
		o.PoolConfig(cfg)
	}
	if db.Pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatalf("annalstest: connect to %s: %v", name, err)
	}
	t.Cleanup(db.Pool.Close) // runs before the drop: cleanups run last-in first-out
	if err := db.Pool.Ping(ctx); err != nil {
		t.Fatalf("annalstest: connect to %s: %v", name, err)
	}
	return db
}

// newDBName returns a unique database name that shows which test made it.
func newDBName(testName string) string {
	var slug strings.Builder
	for _, r := range strings.ToLower(testName) {
		if slug.Len() == 24 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			slug.WriteRune(r)
		case slug.Len() > 0 && !strings.HasSuffix(slug.String(), "_"):
			slug.WriteByte('_')
		}
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails
	return dbPrefix + strings.TrimSuffix(slug.String(), "_") + "_" + hex.EncodeToString(b[:])
}

// withDatabase returns the connection string u pointed at database name. u is
// a postgres:// URL or a keyword/value string ("host=... user=...").
func withDatabase(u, name string) string {
	if strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://") {
		pu, err := url.Parse(u)
		if err == nil {
			pu.Path = "/" + name
			pu.RawPath = ""
			q := pu.Query()
			if q.Has("dbname") {
				q.Set("dbname", name)
				pu.RawQuery = q.Encode()
			}
			return pu.String()
		}
	}
	// In keyword/value strings a later keyword wins.
	return strings.TrimSpace(u) + " dbname=" + name
}
