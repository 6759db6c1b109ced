package migrations

import (
	"bytes"
	"context"
	_ "embed"
	"slices"
	"strings"
	"text/template"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/schemaname"
)

//go:embed grant.sql
var grantSQL string

// RoleKind is the job of a database role, for [Grant].
type RoleKind string

// The kinds of role [Grant] knows. Each gets USAGE on the schema and SELECT
// on events and streams; none gets INSERT, UPDATE, DELETE or TRUNCATE on
// events or streams, so none can write the log but through the append
// functions, which run as the schema's owner.
const (
	// Reader reads the log (events and streams, and the checkpoints and dead
	// letters the catch-up engine's read looks at) and writes nothing.
	Reader RoleKind = "reader"
	// Writer reads and appends (EXECUTE on the append functions), and loads
	// and saves aggregate snapshots: an application service.
	Writer RoleKind = "writer"
	// Runner runs projections, observers, sagas and the scheduler: it has
	// all a Reader has, appends through the functions and writes
	// checkpoints, instances, failures, dead letters, timers, cron tasks and
	// ticks, and saga states. A projection's own read-model tables are the
	// application's to grant.
	Runner RoleKind = "runner"
	// Operator is a runner that also purges dead letters, deletes cron tasks,
	// scavenges, archives and reads the machinery's records: `annals dlq`,
	// `annals checkpoint set`, `annals schedule`, `annals status`, `annals
	// verify` and rebuilds. It does not read snapshots, which hold
	// aggregates' state decrypted.
	Operator RoleKind = "operator"
)

// RoleKinds lists the kinds in order of increasing rights.
var RoleKinds = []RoleKind{Reader, Writer, Runner, Operator}

// grantGroups maps each kind to the groups of grant.sql it gets. A runner
// and an operator get all a reader gets (observe included: run grants most
// of it again, but not SELECT on audit_log, the console's audit page).
var grantGroups = map[RoleKind][]string{
	Reader:   {"schema", "read", "observe"},
	Writer:   {"schema", "read", "append", "snapshots"},
	Runner:   {"schema", "read", "observe", "append", "run", "locks"},
	Operator: {"schema", "read", "observe", "append", "run", "operate", "locks"},
}

// ParseRoleKind returns the kind named s ("reader", "writer", "runner" or
// "operator"), or an error matching [ErrInvalidRoleKind].
func ParseRoleKind(s string) (RoleKind, error) {
	k := RoleKind(strings.ToLower(strings.TrimSpace(s)))
	if _, ok := grantGroups[k]; !ok {
		return "", errors.Wrapf(ErrInvalidRoleKind, "%q: want reader, writer, runner or operator", s)
	}
	return k, nil
}

var (
	// ErrInvalidRoleKind is returned for a [RoleKind] that is not one of
	// [RoleKinds], and for an empty role name.
	ErrInvalidRoleKind = errors.New("migrations: invalid role kind")
	// ErrRoleNotFound is returned by [Grant] when the role does not exist,
	// and by [RestrictAdvisoryLocks] when an owner it names does not: they
	// never create roles (create it with CREATE ROLE first). The error's
	// message names the role, then says so.
	ErrRoleNotFound = errors.New("migrations: role does not exist")
)

// roleNotFound is the ErrRoleNotFound of a missing role: the cause first,
// then what to do (CREATE ROLE role create). what, if not empty, says what
// the role was named as.
func roleNotFound(role, what, create string) error {
	id := pgx.Identifier{role}.Sanitize()
	if what != "" {
		what = ", " + what + ","
	}
	return errmark.Mark(errors.Newf("migrations: role %s%s does not exist: create it first (CREATE ROLE %s %s)", id, what, id, create),
		ErrRoleNotFound)
}

// GrantSQL returns the statements that give role what a role of kind needs in
// the configured schema, one statement per string, in the order [Grant] runs
// them. The role name appears only as a quoted identifier.
func GrantSQL(role string, kind RoleKind, cfg *Config) ([]string, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	groups, ok := grantGroups[kind]
	if !ok {
		return nil, errors.Wrapf(ErrInvalidRoleKind, "%q: want reader, writer, runner or operator", string(kind))
	}
	if role == "" || strings.ContainsRune(role, 0) {
		return nil, errors.Wrap(ErrInvalidRoleKind, "the role name must be non-empty and contain no NUL byte")
	}
	blocks, err := grantBlocks(c.Schema, role)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, g := range groups {
		b, ok := blocks[g]
		if !ok {
			return nil, errors.AssertionFailedf("grant.sql has no group %q", g)
		}
		out = append(out, b...)
	}
	return out, nil
}

// Grant gives the existing role exactly what a role of kind needs in the
// configured schema (see [RoleKind]), in one transaction. It must run as the
// schema's owner (the role that ran [Up]) or a superuser. The EXECUTE
// privileges on PostgreSQL's advisory-lock functions that runners and
// operators get (grant.sql's locks group) are granted only by a superuser,
// and matter only once [RestrictAdvisoryLocks] took them from PUBLIC; from
// then on, the first grant of a runner or operator needs a superuser
// ([ErrNotSuperuser]); granting a role that has its lock functions again
// (the owner's grants at the next deploy) does not, nor does granting a
// writer or a reader. It only adds privileges: to take a kind's rights
// away, REVOKE them. A role that does not exist is an error matching
// [ErrRoleNotFound].
func Grant(ctx context.Context, pool *pgxpool.Pool, role string, kind RoleKind, cfg *Config) error {
	_, err := GrantCounted(ctx, pool, role, kind, cfg)
	return err
}

// GrantCounted is [Grant], and returns how many of [GrantSQL]'s statements
// ran: all of them as a superuser; without the locks group's otherwise.
func GrantCounted(ctx context.Context, pool *pgxpool.Pool, role string, kind RoleKind, cfg *Config) (int, error) {
	stmts, err := GrantSQL(role, kind, cfg)
	if err != nil {
		return 0, err
	}
	c, _ := cfg.withDefaults() // validated by GrantSQL
	blocks, err := grantBlocks(c.Schema, role)
	if err != nil {
		return 0, err
	}
	var lockStmts []string // the kind's statements of the locks group
	if slices.Contains(grantGroups[kind], "locks") {
		lockStmts = blocks["locks"]
	}
	ran := 0
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ran = 0
		// Concurrent GRANTs on one object fail in PostgreSQL ("tuple
		// concurrently updated"): grants to one schema take turns.
		// pg_catalog's functions, named so: a role that may create objects
		// in public could otherwise plant one (of float8, which untyped
		// parameters match better) that runs as the granting owner.
		if err := pinSearchPath(ctx, tx); err != nil {
			return err
		}
		k1, k2 := lockkey.Pair(c.Schema + ":grant")
		if _, err := tx.Exec(ctx, `SELECT pg_catalog.pg_advisory_xact_lock($1, $2)`, k1, k2); err != nil {
			return errors.Wrap(err, "migrations: wait for other grants to the schema")
		}
		var exists bool
		if err := tx.QueryRow(ctx, blocks["role_exists"][0], role).Scan(&exists); err != nil {
			return errors.Wrap(err, "migrations: look up the role")
		}
		if !exists {
			return roleNotFound(role, "", "LOGIN ...")
		}
		// The locks groups change pg_catalog's functions, which every
		// schema of the database shares.
		locks := false
		if lockStmts != nil {
			if err := lockFunctionPrivileges(ctx, tx); err != nil {
				return err
			}
			ok, err := grantsLockFunctions(ctx, tx, role, lockStmts)
			if err != nil {
				return err
			}
			locks = ok
		}
		for _, s := range stmts {
			if !locks && slices.Contains(lockStmts, s) {
				continue
			}
			if _, err := tx.Exec(ctx, s); err != nil {
				return errors.Wrapf(err, "migrations: grant %s to %s in schema %s (is the schema migrated, and are you its owner?)",
					kind, pgx.Identifier{role}.Sanitize(), schemaname.Ident(c.Schema))
			}
			ran++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return ran, nil
}

// grantBlocks returns the statements of grant.sql by group, rendered for
// schema and role. The file is split into statements before rendering, so a
// name with a line break in it cannot change where one ends.
func grantBlocks(schema, role string) (map[string][]string, error) {
	data := struct{ Schema, Role string }{schemaname.Ident(schema), pgx.Identifier{role}.Sanitize()}
	out := map[string][]string{}
	group := ""
	for i, line := range strings.Split(grantSQL, "\n") {
		line = strings.TrimSpace(line)
		if name, ok := strings.CutPrefix(line, "-- name:"); ok {
			group = strings.TrimSpace(name)
			continue
		}
		if line == "" || strings.HasPrefix(line, "--") {
			continue
		}
		if group == "" || !strings.HasSuffix(line, ";") {
			return nil, errors.AssertionFailedf("grant.sql:%d: not one statement on one line in a group", i+1)
		}
		t, err := template.New("grant.sql").Option("missingkey=error").Parse(line)
		if err != nil {
			return nil, errors.Wrapf(err, "parse grant.sql:%d", i+1)
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, data); err != nil {
			return nil, errors.Wrapf(err, "render grant.sql:%d", i+1)
		}
		out[group] = append(out[group], buf.String())
	}
	return out, nil
}

// String returns the kind's name.
func (k RoleKind) String() string { return string(k) }
