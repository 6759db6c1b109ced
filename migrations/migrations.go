package migrations

import (
	"context"
	"embed"
	"fmt"
	"log/slog"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
)

//go:embed sql/*.sql
var files embed.FS

//go:embed bookkeeping.sql
var bookkeepingSQL string

func bookkeeping(schema string) (map[string]string, error) {
	return sqltmpl.Named("bookkeeping.sql", bookkeepingSQL, sqltmpl.NewData(schema))
}

// Config configures Up, Status and Script. A nil *Config means defaults.
type Config struct {
	// Schema is the PostgreSQL schema that holds the annals tables.
	// Defaults to "annals".
	Schema string
	// Logger receives one line per applied migration (information).
	// Defaults to warnings and errors on slog.Default(): those lines are
	// dropped.
	Logger *slog.Logger
}

func (c *Config) withDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	var err error
	if out.Schema, err = schemaname.Resolve(out.Schema); err != nil {
		return out, err
	}
	if out.Logger == nil {
		out.Logger = telemetry.DefaultLogger()
	}
	return out, nil
}

// Migration is one versioned step of the schema, rendered for a schema name.
type Migration struct {
	// Version orders the migrations; it starts at 1 and has no gaps.
	Version int
	// Name is the file name without its version and extension, e.g. "events".
	Name string
	// SQL is the statement text with the schema name filled in. From All it
	// starts with pinMigration (SET LOCAL search_path = pg_catalog,
	// pg_temp), as Up runs it: a tool that applies it in a transaction, or
	// as one multi-statement query, binds nothing to objects in the
	// session's search_path (see docs/sql-api.md), and its own next
	// statements keep the session's path.
	SQL string
}

// pinMigration starts each migration All returns: Up's pin
// (queries "PinSearchPath"), for other tools.
const pinMigration = "SET LOCAL search_path = pg_catalog, pg_temp;\n"

// State is a migration and whether the database has it.
type State struct {
	Migration
	// Applied reports whether the migration is recorded in schema_migrations.
	Applied bool
	// AppliedAt is when it was applied; zero when it is pending.
	AppliedAt time.Time
}

// All returns every migration this version of annals knows, rendered for the
// configured schema, in version order, each pinning the search_path of its
// transaction (see Migration.SQL).
func All(cfg *Config) ([]Migration, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ms, err := render(c.Schema)
	for i := range ms {
		ms[i].SQL = pinMigration + ms[i].SQL
	}
	return ms, err
}

func render(schema string) ([]Migration, error) {
	entries, err := files.ReadDir("sql")
	if err != nil {
		return nil, errors.Wrap(err, "read embedded migrations")
	}
	data := sqltmpl.NewData(schema)
	var out []Migration
	for _, e := range entries {
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || version <= 0 {
			return nil, errors.Newf("embedded migration %s is not named NNNN_name.sql", e.Name())
		}
		src, err := files.ReadFile(path.Join("sql", e.Name()))
		if err != nil {
			return nil, errors.Wrapf(err, "read embedded migration %s", e.Name())
		}
		sql, err := sqltmpl.Render(e.Name(), string(src), data)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: version, Name: name, SQL: sql})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, errors.Newf("embedded migrations are not numbered 1..n: found version %d at position %d", m.Version, i+1)
		}
	}
	return out, nil
}

// Script returns the whole schema as one SQL script, for teams that apply
// migrations with their own tool. It creates the schema if needed and does not
// touch schema_migrations; each migration is introduced by a comment.
func Script(cfg *Config) (string, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return "", err
	}
	ms, err := render(c.Schema)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- annals schema for %s: %d migration(s).\n", schemaname.Ident(c.Schema), len(ms))
	// Up's PinSearchPath, for the session that runs the script (RESET at
	// the end).
	fmt.Fprintf(&b, "SET search_path = pg_catalog, pg_temp;\n")
	fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n", schemaname.Ident(c.Schema))
	for _, m := range ms {
		fmt.Fprintf(&b, "\n-- annals migration %04d: %s\n%s\n", m.Version, m.Name, strings.TrimSpace(m.SQL))
	}
	// The session's own search_path again, for what the tool runs next.
	fmt.Fprintf(&b, "\nRESET search_path;\n")
	return b.String(), nil
}

// Up applies every pending migration in version order and returns the ones it
// applied (none when the schema is current). It is safe to call from several
// processes at once and to call again.
//
// Up is all or nothing: the schema's creation, every pending migration and
// their records in schema_migrations run in one transaction (PostgreSQL's DDL
// is transactional), so a migration that fails leaves the database as it was
// before the call, without a half-made schema. A schema name that is refused
// (schemaname.ErrInvalid) is refused before any SQL is sent.
//
// When every migration is applied already, Up only reads schema_migrations
// (no lock, no CREATE SCHEMA), so that it succeeds for any role granted by
// [Grant]; with migrations pending, a role without the privileges to apply
// them gets an error matching [ErrNotOwner].
func Up(ctx context.Context, pool *pgxpool.Pool, cfg *Config) ([]Migration, error) {
	return up(ctx, pool, cfg, nil)
}

// up is Up; edit, when not nil, changes the migrations to apply (tests use it
// to add one that fails).
func up(ctx context.Context, pool *pgxpool.Pool, cfg *Config, edit func([]Migration) []Migration) ([]Migration, error) {
	c, ms, q, conn, err := open(ctx, pool, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	if edit != nil {
		ms = edit(ms)
	}

	// Nothing to do, as is the rule once the schema's owner has migrated:
	// said without the lock and the CREATE SCHEMA, which a role that only
	// uses the schema (annals grant) may not run (PostgreSQL checks the
	// database's CREATE privilege before it looks whether the schema
	// exists). Every role granted anything may read schema_migrations; one
	// that may not goes the long way.
	if current, err := applied(ctx, conn, q, ms); err == nil && current {
		return nil, nil
	}

	// The migration lock is taken for the transaction that applies the
	// migrations, as its first statement: all of Up's work is one
	// transaction, so that a pooler in transaction mode keeps it on one
	// server session, and the lock goes with the transaction whatever
	// happens to the client. (A session lock, as before 2026-11-30, stayed
	// on the pooler's server session when the unlock ran on another.) Old
	// and new Ups exclude each other: a session and a transaction lock of
	// one key conflict.
	k1, k2 := schemaname.MigrateLockKey(c.Schema)
	// READ COMMITTED whatever the connection's default: under the lock, each
	// statement must see what an Up that held it before has committed.
	var done []Migration
	var took []time.Duration
	err = pgx.BeginTxFunc(ctx, conn.Conn(), pgtx.ReadCommitted, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, q["Lock"], k1, k2); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "42501" {
				// RestrictAdvisoryLocks took the lock functions from
				// PUBLIC, and this role owns no annals schema yet (or was
				// not named).
				return errors.Wrap(ErrNotSuperuser, "migrations: advisory locks are restricted in this database and this role may not take "+
					"the migration lock: a superuser runs 'annals advisory-locks restrict --owner ROLE' for the role that migrates (or migrates itself)")
			}
			return errors.Wrap(err, "migrations: take the migration lock")
		}
		// Another Up (the deploy job's) may have applied them while this
		// one waited for the lock: looked at again before the CREATE
		// SCHEMA, which a role that only uses the schema may not run.
		// (In a savepoint: a role that may not read schema_migrations
		// must get the owner's error below, not an aborted transaction.)
		if current, err := appliedInSavepoint(ctx, tx, q, ms); err == nil && current {
			return nil
		}
		if _, err := tx.Exec(ctx, q["PinSearchPath"]); err != nil {
			return errors.Wrap(err, "migrations: pin the search_path")
		}
		if _, err := tx.Exec(ctx, q["Bootstrap"]); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "42501" {
				return errmark.Mark(errors.Wrapf(err, "migrations: create schema %s: the schema has migrations to apply and this role may not apply them: "+
					"run 'annals migrate' as the schema's owner (a service on a role of its own sets annals.Config.SkipMigrations)", schemaname.Ident(c.Schema)), ErrNotOwner)
			}
			return errors.Wrapf(err, "migrations: create schema %s", schemaname.Ident(c.Schema))
		}
		applied, err := appliedVersions(ctx, tx, q["Applied"])
		if err != nil {
			return err
		}
		if _, made := applied[1]; !made {
			// A new log (its tables, migration 1, to be made): not in a
			// schema another role made and owns, which could drop and
			// replace its tables and functions. Judged by migration 1,
			// not by an empty schema_migrations: the squatter may make
			// that table too, with a row of its own.
			var (
				owner string
				ok    bool
			)
			if err := tx.QueryRow(ctx, q["SchemaOwner"]).Scan(&owner, &ok); err != nil {
				return errors.Wrapf(err, "migrations: look up the owner of schema %s", schemaname.Ident(c.Schema))
			}
			if !ok {
				return errors.Wrapf(ErrSchemaOwnedByAnother, "migrations: schema %s exists, owned by %s, which could drop or replace the log's tables and functions: "+
					"nothing was applied; make the role that migrates its owner (ALTER SCHEMA %s OWNER TO ...) or drop it, then migrate",
					schemaname.Ident(c.Schema), schemaname.Ident(owner), schemaname.Ident(c.Schema))
			}
		}
		for _, m := range ms {
			if _, ok := applied[m.Version]; ok {
				continue
			}
			start := time.Now()
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				var pe *pgconn.PgError
				if errors.As(err, &pe) && pe.Code == "42501" {
					err = errmark.Mark(errors.Wrap(err, "this role may not apply it: run 'annals migrate' as the schema's owner (a service on a role of its own sets annals.Config.SkipMigrations)"), ErrNotOwner)
				}
				return errors.Wrapf(err, "migrations: apply %04d_%s (nothing was applied)", m.Version, m.Name)
			}
			if _, err := tx.Exec(ctx, q["Record"], m.Version, m.Name); err != nil {
				return errors.Wrapf(err, "migrations: record %04d_%s (nothing was applied)", m.Version, m.Name)
			}
			done, took = append(done, m), append(took, time.Since(start))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i, m := range done {
		c.Logger.InfoContext(ctx, "annals: applied migration",
			slog.Int("version", m.Version), slog.String("name", m.Name),
			slog.String("schema", c.Schema), slog.Duration("took", took[i]))
	}
	return done, nil
}

// Status reports every known migration and whether it is applied. Versions
// recorded in the database that this binary does not know (a newer annals
// migrated it) are returned too, with an empty SQL.
func Status(ctx context.Context, pool *pgxpool.Pool, cfg *Config) ([]State, error) {
	_, ms, q, conn, err := open(ctx, pool, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	var exists bool
	if err := conn.QueryRow(ctx, q["TableExists"]).Scan(&exists); err != nil {
		return nil, errors.Wrap(err, "migrations: look for schema_migrations")
	}
	applied := map[int]appliedRow{}
	if exists {
		if applied, err = appliedVersions(ctx, conn.Conn(), q["Applied"]); err != nil {
			return nil, err
		}
	}
	var out []State
	for _, m := range ms {
		a, ok := applied[m.Version]
		out = append(out, State{Migration: m, Applied: ok, AppliedAt: a.at})
		delete(applied, m.Version)
	}
	for v, a := range applied {
		out = append(out, State{Migration: Migration{Version: v, Name: a.name}, Applied: true, AppliedAt: a.at})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// open resolves the config, renders the migrations and the bookkeeping
// statements, and acquires the connection Up and Status work on.
func open(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (Config, []Migration, map[string]string, *pgxpool.Conn, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return c, nil, nil, nil, err
	}
	ms, err := render(c.Schema)
	if err != nil {
		return c, nil, nil, nil, err
	}
	q, err := bookkeeping(c.Schema)
	if err != nil {
		return c, nil, nil, nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return c, nil, nil, nil, errors.Wrap(err, "migrations: acquire connection")
	}
	return c, ms, q, conn, nil
}

// applied reports whether every migration of ms is recorded in the
// schema's schema_migrations (false, nil when the table does not exist).
func applied(ctx context.Context, conn rowQuerier, q map[string]string, ms []Migration) (bool, error) {
	var exists bool
	if err := conn.QueryRow(ctx, q["TableExists"]).Scan(&exists); err != nil || !exists {
		return false, errors.Wrap(err, "migrations: look for schema_migrations")
	}
	done, err := appliedVersions(ctx, conn, q["Applied"])
	if err != nil {
		return false, err
	}
	for _, m := range ms {
		if _, ok := done[m.Version]; !ok {
			return false, nil
		}
	}
	return true, nil
}

type appliedRow struct {
	name string
	at   time.Time
}

// querier is what appliedVersions reads with: a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// appliedInSavepoint is applied in a savepoint of tx, which an error rolls
// back, leaving tx usable.
func appliedInSavepoint(ctx context.Context, tx pgx.Tx, q map[string]string, ms []Migration) (bool, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return false, err
	}
	current, err := applied(ctx, sp, q, ms)
	if err != nil {
		return false, errors.CombineErrors(err, sp.Rollback(ctx))
	}
	return current, sp.Commit(ctx)
}

// rowQuerier is what applied reads with: a pool's connection or a
// transaction.
type rowQuerier interface {
	querier
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func appliedVersions(ctx context.Context, conn querier, query string) (map[int]appliedRow, error) {
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return nil, errors.Wrap(err, "migrations: read schema_migrations")
	}
	out := map[int]appliedRow{}
	var v int
	var a appliedRow
	_, err = pgx.ForEachRow(rows, []any{&v, &a.name, &a.at}, func() error {
		out[v] = a
		return nil
	})
	return out, errors.Wrap(err, "migrations: read schema_migrations")
}
