package migrations

import (
	"context"
	"regexp"
	"slices"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/lockkey"
)

// lockFunctions are PostgreSQL's functions that take an advisory lock, all
// of them: the ones [RestrictAdvisoryLocks] takes from PUBLIC. The unlock
// functions stay open: a session can give back only its own locks.
var lockFunctions = []string{
	"pg_catalog.pg_advisory_lock(bigint)",
	"pg_catalog.pg_advisory_lock(integer, integer)",
	"pg_catalog.pg_advisory_lock_shared(bigint)",
	"pg_catalog.pg_advisory_lock_shared(integer, integer)",
	"pg_catalog.pg_try_advisory_lock(bigint)",
	"pg_catalog.pg_try_advisory_lock(integer, integer)",
	"pg_catalog.pg_try_advisory_lock_shared(bigint)",
	"pg_catalog.pg_try_advisory_lock_shared(integer, integer)",
	"pg_catalog.pg_advisory_xact_lock(bigint)",
	"pg_catalog.pg_advisory_xact_lock(integer, integer)",
	"pg_catalog.pg_advisory_xact_lock_shared(bigint)",
	"pg_catalog.pg_advisory_xact_lock_shared(integer, integer)",
	"pg_catalog.pg_try_advisory_xact_lock(bigint)",
	"pg_catalog.pg_try_advisory_xact_lock(integer, integer)",
	"pg_catalog.pg_try_advisory_xact_lock_shared(bigint)",
	"pg_catalog.pg_try_advisory_xact_lock_shared(integer, integer)",
}

// ErrNotSuperuser is returned by [RestrictAdvisoryLocks] and
// [AllowAdvisoryLocks] when the session's role is not a superuser: the
// advisory-lock functions belong to PostgreSQL's bootstrap superuser, and
// only a superuser can change who may call them.
var ErrNotSuperuser = errors.New("migrations: changing who may take advisory locks needs a superuser (PostgreSQL's bootstrap superuser owns the functions)")

// AdvisoryLockAccess says who may take advisory locks in the database.
type AdvisoryLockAccess struct {
	// Restricted reports that PUBLIC may call none of PostgreSQL's
	// functions that take an advisory lock (RestrictAdvisoryLocks ran).
	// Partly restricted (some functions revoked, by hand) counts as not.
	Restricted bool `json:"restricted"`
	// Roles lists the roles granted any of those functions by name, in
	// name order (superusers may call them all in any case).
	Roles []string `json:"roles"`
	// Owners and Runners list, in name order, the roles that
	// [RestrictAdvisoryLocks] grants lock functions to: the owners of the
	// database's annals schemas and of their SECURITY DEFINER functions
	// (every lock function: those functions run as their owner), and the
	// roles that run subscribers there (runners and operators: the locks
	// group of grant.sql). Superusers are left out: they may call every
	// function. Writers and readers need none.
	Owners  []string `json:"owners"`
	Runners []string `json:"runners"`
}

// AdvisoryLocks reports who may take advisory locks in the pool's database.
// Any role can call it.
func AdvisoryLocks(ctx context.Context, pool *pgxpool.Pool) (*AdvisoryLockAccess, error) {
	var a AdvisoryLockAccess
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pinSearchPath(ctx, tx); err != nil {
			return err
		}
		var err error
		a, err = advisoryLockAccess(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &a, nil
}

func advisoryLockAccess(ctx context.Context, tx pgx.Tx) (AdvisoryLockAccess, error) {
	var a AdvisoryLockAccess
	// PUBLIC's EXECUTE shows as an ACL entry with grantee 0 (or as a NULL
	// ACL, PostgreSQL's default, which gives PUBLIC EXECUTE).
	err := tx.QueryRow(ctx, `
SELECT NOT bool_or(p.proacl IS NULL
                   OR EXISTS (SELECT 1 FROM pg_catalog.aclexplode(p.proacl) x
                               WHERE x.grantee = 0 AND x.privilege_type = 'EXECUTE')),
       coalesce((SELECT array_agg(DISTINCT r.rolname ORDER BY r.rolname)
                   FROM pg_catalog.pg_proc q, pg_catalog.aclexplode(q.proacl) x
                   JOIN pg_catalog.pg_roles r ON r.oid = x.grantee
                  WHERE q.oid = ANY ($1::regprocedure[]) AND x.privilege_type = 'EXECUTE'
                    AND x.grantee <> q.proowner), '{}')
  FROM pg_catalog.pg_proc p
 WHERE p.oid = ANY ($1::regprocedure[])`, lockFunctions).Scan(&a.Restricted, &a.Roles)
	if err != nil {
		return a, errors.Wrap(err, "migrations: read who may take advisory locks")
	}
	// The annals schemas of the database: those with append_events (0001)
	// and a checkpoints table, whatever their names (several may share a
	// database). Their owners and the owners of their SECURITY DEFINER
	// functions (which run as the function's owner, and take locks); the
	// roles that may create read-model schemas there, which grant.sql's run
	// group gives runners and operators only (a function: no predefined
	// role such as pg_write_all_data reaches it). Superusers need nothing.
	err = tx.QueryRow(ctx, `
WITH annals AS (
    SELECT n.oid AS nsp, n.nspowner AS owner
      FROM pg_catalog.pg_namespace n
     WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.pronamespace = n.oid AND p.proname = 'append_events')
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                    WHERE c.relnamespace = n.oid AND c.relname = 'checkpoints' AND c.relkind = 'r')
), owners AS (
    SELECT owner FROM annals
    UNION
    SELECT p.proowner FROM pg_catalog.pg_proc p JOIN annals a ON a.nsp = p.pronamespace WHERE p.prosecdef
), roles AS (
    SELECT r.oid, r.rolname FROM pg_catalog.pg_roles r
     WHERE NOT r.rolsuper AND r.rolname !~ '^pg_'
)
SELECT coalesce((SELECT array_agg(DISTINCT r.rolname ORDER BY r.rolname) FROM roles r JOIN owners o ON o.owner = r.oid), '{}'),
       coalesce((SELECT array_agg(DISTINCT r.rolname ORDER BY r.rolname)
                   FROM roles r, annals a
                   JOIN pg_catalog.pg_proc p ON p.pronamespace = a.nsp AND p.proname = 'read_model_create_schema'
                  WHERE r.oid NOT IN (SELECT owner FROM owners)
                    AND pg_catalog.has_function_privilege(r.oid, p.oid, 'EXECUTE')), '{}')`).
		Scan(&a.Owners, &a.Runners)
	if err != nil {
		return a, errors.Wrap(err, "migrations: find the roles of the database's annals schemas")
	}
	return a, nil
}

// RestrictAdvisoryLocks takes the functions that take advisory locks from
// PUBLIC in the pool's database, so that a role that can merely connect, or
// a writer, can no longer hold annals' locks (the log's ordering lock, a
// subscriber's leadership, Forget's, the scavenger's) and stall it. It needs
// a superuser and changes the whole database (pg_catalog's functions are
// per database), not one schema: a program of another team that takes
// advisory locks in the same database needs them granted too (GRANT EXECUTE
// ON FUNCTION pg_catalog.pg_advisory_lock(bigint) TO ...).
//
// In the same transaction it grants, so that annals goes on working: every
// lock function to the owners of the database's annals schemas and of their
// SECURITY DEFINER functions (the append functions run as their owner and
// take the ordering lock; [Up] takes the migration lock), and to the roles
// named in owners, which will own a schema not migrated yet (its first [Up]
// takes the migration lock before the schema exists); and the runner's lock
// functions (grant.sql's locks group) to every role that may run
// subscribers in an annals schema. Writers need none (they take their two
// locks through the schema's functions, migration 0034). A runner or
// operator granted afterwards gets its lock functions from [Grant], which
// then needs a superuser too. It is idempotent; [AllowAdvisoryLocks] undoes
// it. It returns the access after the change. A role in owners that does
// not exist is an error matching [ErrRoleNotFound].
func RestrictAdvisoryLocks(ctx context.Context, pool *pgxpool.Pool, owners ...string) (*AdvisoryLockAccess, error) {
	return changeAdvisoryLocks(ctx, pool, true, owners)
}

// AllowAdvisoryLocks gives PUBLIC back the functions that take advisory
// locks (PostgreSQL's default), undoing [RestrictAdvisoryLocks]. The grants
// to roles by name stay (they change nothing while PUBLIC has the
// functions). It needs a superuser.
func AllowAdvisoryLocks(ctx context.Context, pool *pgxpool.Pool) (*AdvisoryLockAccess, error) {
	return changeAdvisoryLocks(ctx, pool, false, nil)
}

func changeAdvisoryLocks(ctx context.Context, pool *pgxpool.Pool, restrict bool, owners []string) (*AdvisoryLockAccess, error) {
	var out AdvisoryLockAccess
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pinSearchPath(ctx, tx); err != nil {
			return err
		}
		var super bool
		if err := tx.QueryRow(ctx, `SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user`).Scan(&super); err != nil {
			return errors.Wrap(err, "migrations: look up the session's role")
		}
		if !super {
			return errors.WithStack(ErrNotSuperuser)
		}
		if err := lockFunctionPrivileges(ctx, tx); err != nil {
			return err
		}
		if !restrict {
			for _, f := range lockFunctions {
				if _, err := tx.Exec(ctx, "GRANT EXECUTE ON FUNCTION "+f+" TO PUBLIC"); err != nil {
					return errors.Wrapf(err, "migrations: give %s back to PUBLIC", f)
				}
			}
			var err error
			out, err = advisoryLockAccess(ctx, tx)
			return err
		}
		for _, o := range owners {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1)`, o).Scan(&exists); err != nil {
				return errors.Wrap(err, "migrations: look up the role")
			}
			if !exists || o == "" {
				return roleNotFound(o, "named as an owner", "...")
			}
		}
		before, err := advisoryLockAccess(ctx, tx)
		if err != nil {
			return err
		}
		for _, owner := range append(slices.Clone(before.Owners), owners...) {
			for _, f := range lockFunctions {
				if _, err := tx.Exec(ctx, "GRANT EXECUTE ON FUNCTION "+f+" TO "+pgx.Identifier{owner}.Sanitize()); err != nil {
					return errors.Wrapf(err, "migrations: grant %s to the owner %s", f, owner)
				}
			}
		}
		for _, r := range before.Runners {
			if err := runGroups(ctx, tx, r, "locks"); err != nil {
				return err
			}
		}
		for _, f := range lockFunctions {
			if _, err := tx.Exec(ctx, "REVOKE EXECUTE ON FUNCTION "+f+" FROM PUBLIC"); err != nil {
				return errors.Wrapf(err, "migrations: take %s from PUBLIC", f)
			}
		}
		out, err = advisoryLockAccess(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// pinSearchPath resolves tx's unqualified names in pg_catalog only: these
// statements run as a superuser or the schema's owner, and a function or
// aggregate planted in public (which every role may create there on
// PostgreSQL 14 and older) that matches a call more closely than
// pg_catalog's (an array_agg of name, where pg_catalog's is polymorphic)
// would run as that role.
func pinSearchPath(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SET LOCAL search_path = pg_catalog, pg_temp`)
	return errors.Wrap(err, "migrations: pin the search_path")
}

// lockFunctionPrivileges takes, until tx ends, the database-wide lock under
// which the privileges of the lock functions change: Grant takes it after
// its schema's lock, RestrictAdvisoryLocks and AllowAdvisoryLocks alone.
func lockFunctionPrivileges(ctx context.Context, tx pgx.Tx) error {
	k1, k2 := lockkey.Pair("annals:advisory-locks")
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.pg_advisory_xact_lock($1, $2)`, k1, k2); err != nil {
		return errors.Wrap(err, "migrations: wait for other changes of the lock functions' privileges")
	}
	return nil
}

// grantsLockFunctions reports whether Grant, in tx, runs lockStmts (the
// statements of grant.sql's locks group, for a runner or operator): as a superuser,
// always (so the role is ready for a restriction); as another role (a
// schema owner), never: it has no grant option on PostgreSQL's functions,
// so they would grant nothing. That is enough while PUBLIC may take
// advisory locks, and once it may not, for a role that has its lock
// functions already (the owner's `annals grant` again at the next deploy);
// a role that lacks them is ErrNotSuperuser: its first grant needs a
// superuser.
func grantsLockFunctions(ctx context.Context, tx pgx.Tx, role string, lockStmts []string) (bool, error) {
	var super, public bool
	err := tx.QueryRow(ctx, `
SELECT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user),
       pg_catalog.has_function_privilege('public', 'pg_catalog.pg_advisory_lock(integer, integer)', 'EXECUTE')`).Scan(&super, &public)
	if err != nil {
		return false, errors.Wrap(err, "migrations: look up who may take advisory locks")
	}
	if super || public {
		return super, nil
	}
	for _, s := range lockStmts {
		m := lockFunctionRE.FindStringSubmatch(s)
		if m == nil {
			return false, errors.AssertionFailedf("grant.sql: a locks group's statement names no function: %q", s)
		}
		var has bool
		if err := tx.QueryRow(ctx, `SELECT pg_catalog.has_function_privilege($1, $2::regprocedure, 'EXECUTE')`, role, m[1]).Scan(&has); err != nil {
			return false, errors.Wrap(err, "migrations: look up the role's advisory-lock functions")
		}
		if !has {
			return false, errors.Wrapf(ErrNotSuperuser,
				"role %s may not call %s, and advisory locks are restricted in this database ('annals advisory-locks restrict'): grant it once as a superuser",
				pgx.Identifier{role}.Sanitize(), m[1])
		}
	}
	return false, nil
}

// lockFunctionRE finds the function a statement of a locks group grants.
var lockFunctionRE = regexp.MustCompile(`^GRANT EXECUTE ON FUNCTION (pg_catalog\.[a-z_]+\([a-z, ]*\)) TO `)

// runGroups runs the statements of grant.sql's groups for role. The groups
// used here name no schema object, only pg_catalog's functions.
func runGroups(ctx context.Context, tx pgx.Tx, role string, groups ...string) error {
	blocks, err := grantBlocks("annals", role)
	if err != nil {
		return err
	}
	for _, g := range groups {
		for _, s := range blocks[g] {
			if _, err := tx.Exec(ctx, s); err != nil {
				return errors.Wrapf(err, "migrations: grant the lock functions of %s to %s", g, pgx.Identifier{role}.Sanitize())
			}
		}
	}
	return nil
}
