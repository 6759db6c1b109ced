package annalstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"github.com/cockroachdb/errors"
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
	// isolation is the default_transaction_isolation SetDefaultIsolation
	// gave the database's new sessions ("": the server's).
	isolation string
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
	if opts != nil {
		if _, err := schemaname.Resolve(opts.Schema); err != nil {
			t.Fatalf("annalstest: %v", err)
			return nil
		}
	}
	db, closeDB, err := open(t.Context(), t.Name(), opts)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := closeDB(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return db
}

// Open is NewDB for code without a testing.TB (Example functions, a
// TestMain, a benchmark harness): it returns the database and a function
// that closes its pool and drops it. The first call chooses the server as
// NewDB does; without annalstest.Main, a throwaway cluster it starts ends
// with the process.
func Open(ctx context.Context, opts *Options) (*DB, func() error, error) {
	return open(ctx, "open", opts)
}

func open(ctx context.Context, label string, opts *Options) (*DB, func() error, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	var err error
	if o.Schema, err = schemaname.Resolve(o.Schema); err != nil {
		return nil, nil, errors.Wrap(err, "annalstest")
	}
	srv, err := getServer()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, setupFor)
	defer cancel()
	tpl, err := srv.template(ctx, o.Schema)
	if err != nil {
		return nil, nil, err
	}

	name := newDBName(label)
	if _, err := srv.admin.Exec(ctx, bind("CloneTemplate", name, tpl)); err != nil {
		return nil, nil, errors.Wrapf(err, "annalstest: create database %s from %s", name, tpl)
	}
	drop := func() error {
		// The caller's context may be over when the database is dropped.
		ctx, cancel := context.WithTimeout(context.Background(), cleanupFor)
		defer cancel()
		_, err := srv.admin.Exec(ctx, bind("DropDatabase", name, ""))
		return errors.Wrapf(err, "annalstest: drop database %s", name)
	}

	db := &DB{URL: withDatabase(srv.adminURL, name), Name: name, Schema: o.Schema}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		return nil, nil, errors.CombineErrors(errors.Wrapf(err, "annalstest: parse %s", db.URL), drop())
	}
	if o.PoolConfig != nil {
		o.PoolConfig(cfg)
	}
	if db.Pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, nil, errors.CombineErrors(errors.Wrapf(err, "annalstest: connect to %s", name), drop())
	}
	closeDB := func() error {
		leaked := closePool(db.Pool, leakGrace)
		err := drop() // WITH (FORCE): ends the sessions of leaked connections
		if leaked > 0 {
			err = errors.CombineErrors(errors.Newf("annalstest: %d connection(s) of the pool of database %s "+
				"were still acquired %v after the test ended: a transaction never committed or rolled back, "+
				"rows never closed, or a connection acquired and never released; the database was dropped anyway",
				leaked, name, leakGrace), err)
		}
		return err
	}
	if err := db.Pool.Ping(ctx); err != nil {
		return nil, nil, errors.CombineErrors(errors.Wrapf(err, "annalstest: connect to %s", name), closeDB())
	}
	return db, closeDB, nil
}

// leakGrace is how long closing a test's pool waits for acquired connections
// to be released before they are reported as leaked. A variable for tests.
var leakGrace = 5 * time.Second

// closePool closes pool, waiting at most grace for its acquired connections to
// be released, and returns how many were still acquired then (0 if the pool
// closed). pgxpool's Close blocks until every acquired connection is released,
// which for a leaked transaction is never; in that case Close goes on in the
// background and ends if the test releases them later.
func closePool(pool *pgxpool.Pool, grace time.Duration) int32 {
	closed := make(chan struct{})
	go func() {
		pool.Close()
		close(closed)
	}()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-closed:
		return 0
	case <-timer.C:
		if n := pool.Stat().AcquiredConns(); n > 0 {
			return n
		}
		<-closed // none acquired: only idle connections being closed, which is bounded
		return 0
	}
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
