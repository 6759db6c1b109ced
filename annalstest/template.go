package annalstest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/migrations"
)

// templatePrefix starts the name of every template database.
const templatePrefix = "annalstest_tpl_"

// templateName names the template for a schema: a hash of the schema name and
// of every migration, so that a changed or added migration gets a new one.
func templateName(schema string) (string, error) {
	ms, err := migrations.All(&migrations.Config{Schema: schema})
	if err != nil {
		return "", errors.Wrap(err, "annalstest: render the migrations")
	}
	h := sha256.New()
	writeField(h, schema)
	for _, m := range ms {
		writeField(h, m.Name)
		writeField(h, m.SQL)
	}
	return templatePrefix + hex.EncodeToString(h.Sum(nil))[:24], nil
}

// writeField writes s length-prefixed, so that field boundaries are part of
// the hash.
func writeField(h hash.Hash, s string) {
	_ = binary.Write(h, binary.BigEndian, uint64(len(s)))
	_, _ = h.Write([]byte(s))
}

// buildName is the name a template is built under before it is published.
func buildName(template string) string { return template + "_build" }

// templateState remembers, within this process, that a template exists.
type templateState struct {
	mu    sync.Mutex
	ready bool
}

// template returns the name of the migrated template database for schema,
// creating it if needed. Within the process, callers for the same template
// queue behind one another; across processes, ensureTemplate serializes them.
func (s *server) template(ctx context.Context, schema string) (string, error) {
	name, err := templateName(schema)
	if err != nil {
		return "", err
	}
	v, _ := s.templates.LoadOrStore(name, &templateState{})
	st := v.(*templateState)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ready {
		return name, nil
	}
	if _, err := ensureTemplate(ctx, s.adminURL, schema, name); err != nil {
		return "", err
	}
	st.ready = true
	return name, nil
}

// ensureTemplate creates the template database name, migrated for schema,
// unless it exists. It reports whether this call built it. Any number of
// processes may call it at once: they serialize on a session advisory lock
// in the admin database, the template is built under a temporary name and
// renamed when complete, so a database with the final name is always whole,
// and a temporary one left by a crashed build is dropped first.
func ensureTemplate(ctx context.Context, adminURL, schema, name string) (built bool, err error) {
	q := queries()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return false, errors.Wrap(err, "annalstest: connect to the admin database")
	}
	// Closing the session also releases the advisory lock.
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()

	exists := func() (bool, error) {
		var ok bool
		err := conn.QueryRow(ctx, q["DatabaseExists"], name).Scan(&ok)
		return ok, errors.Wrapf(err, "annalstest: look for template %s", name)
	}
	if ok, err := exists(); ok || err != nil {
		return false, err
	}
	k1, k2 := lockkey.Pair("annalstest:template:" + name)
	if _, err := conn.Exec(ctx, q["LockTemplate"], k1, k2); err != nil {
		return false, errors.Wrapf(err, "annalstest: lock template %s", name)
	}
	if ok, err := exists(); ok || err != nil {
		return false, err
	}

	build := buildName(name)
	if _, err := conn.Exec(ctx, bind("DropDatabase", build, "")); err != nil {
		return false, errors.Wrapf(err, "annalstest: drop leftover %s", build)
	}
	if _, err := conn.Exec(ctx, bind("CreateEmptyDatabase", build, "")); err != nil {
		return false, errors.Wrapf(err, "annalstest: create %s", build)
	}
	if err := migrate(ctx, withDatabase(adminURL, build), schema); err != nil {
		return false, err
	}
	// Nobody may connect to a template: CREATE DATABASE ... TEMPLATE fails
	// while anyone is connected to it.
	if _, err := conn.Exec(ctx, bind("SealTemplate", build, "")); err != nil {
		return false, errors.Wrapf(err, "annalstest: seal %s", build)
	}
	if _, err := conn.Exec(ctx, bind("PublishTemplate", build, name)); err != nil {
		return false, errors.Wrapf(err, "annalstest: rename %s to %s", build, name)
	}
	return true, nil
}

// migrate applies the migrations to the database at url and closes every
// connection it opened.
func migrate(ctx context.Context, url, schema string) error {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return errors.Wrap(err, "annalstest: parse template URL")
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return errors.Wrap(err, "annalstest: connect to the template")
	}
	defer pool.Close()
	_, err = migrations.Up(ctx, pool, &migrations.Config{Schema: schema})
	return errors.Wrapf(err, "annalstest: migrate the template for schema %q", schema)
}
