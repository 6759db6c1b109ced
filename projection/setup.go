package projection

import (
	"context"
	_ "embed"
	"fmt"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
)

//go:embed setup.sql
var setupSQL string

// Setupper is implemented by projections that create what their read model
// needs (tables, indexes) themselves, so that a service does not repeat its
// CREATE TABLE at start-up. The runner runs Setup before the projection
// first runs (Run, RunUntilCaughtUp) and a rebuild runs it before Reset,
// once per SetupVersion per database (see EnsureSetup). Typed projections
// get it from OnSetup.
type Setupper interface {
	// SetupVersion is the version of Setup: bump it when Setup changes, and
	// the next start runs the new Setup once, over the read model the old one
	// made (write it so that it works on both: ADD COLUMN IF NOT EXISTS).
	// 0 means there is nothing to set up.
	SetupVersion() int
	// Setup creates or upgrades the read model inside tx.
	Setup(ctx context.Context, tx pgx.Tx) error
}

// Statements returns a setup function that executes each statement in
// order, for OnSetup:
//
//	p.OnSetup(1, projection.Statements(`CREATE TABLE IF NOT EXISTS balances (…)`))
func Statements(stmts ...string) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		for i, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return errors.Wrapf(err, "setup statement %d", i+1)
			}
		}
		return nil
	}
}

// ErrSetupIsolation is matched (errors.Is) by the error of EnsureSetup
// called with a transaction that is not READ COMMITTED (a
// *SetupIsolationError).
var ErrSetupIsolation = errors.New("projection: a setup needs a READ COMMITTED transaction")

// SetupIsolationError is the error of EnsureSetup called with a transaction
// whose isolation level is not READ COMMITTED: REPEATABLE READ or
// SERIALIZABLE take their snapshot at the transaction's first statement,
// before the setup lock is granted, so a process that waited for another's
// setup would not see its record and would run the setup a second time.
type SetupIsolationError struct {
	// Projection is the projection's name.
	Projection string
	// Isolation is the transaction's isolation level, as PostgreSQL names
	// it ("repeatable read", "serializable").
	Isolation string
}

// Error implements error.
func (e *SetupIsolationError) Error() string {
	return fmt.Sprintf("projection %q: the setup's transaction is %s; it must be READ COMMITTED "+
		"(pgx.TxOptions{IsoLevel: pgx.ReadCommitted}): in another, a process that waited for another's setup "+
		"would not see its record and would run the setup again", e.Projection, strings.ToUpper(e.Isolation))
}

// Is reports whether target is ErrSetupIsolation.
func (e *SetupIsolationError) Is(target error) bool { return target == ErrSetupIsolation }

// EnsureSetup runs s.Setup in tx for the projection name unless the
// schema's read_model_setups table records version s.SetupVersion() (or a
// later one) for it, and records the version. It first takes a
// transaction-scoped advisory lock on the key schema + ":setup:" + name, so
// processes that start at once run the setup once between them, never
// concurrently: the others wait for the first one's commit, then find its
// record. The setup, its record and whatever else tx does commit together;
// a failed setup records nothing. It reports whether Setup ran.
//
// tx must be READ COMMITTED (begin it with pgx.TxOptions{IsoLevel:
// pgx.ReadCommitted} when the session's default_transaction_isolation may
// say otherwise): a REPEATABLE READ or SERIALIZABLE transaction keeps the
// snapshot of its first statement, taken before the lock was granted, and
// would not see the record of the setup it waited for. EnsureSetup returns
// a *SetupIsolationError (ErrSetupIsolation) for such a transaction,
// without taking the lock or running Setup. The runner, a rebuild, the
// annals client, natsconsumer and testkit begin their setup transactions
// READ COMMITTED whatever the session's default.
func EnsureSetup(ctx context.Context, tx pgx.Tx, schema, name string, s Setupper, by string) (bool, error) {
	v := s.SetupVersion()
	if v <= 0 {
		return false, nil
	}
	schema, err := schemaname.Resolve(schema)
	if err != nil {
		return false, err
	}
	q, err := sqltmpl.Named("setup.sql", setupSQL, sqltmpl.NewData(schema))
	if err != nil {
		return false, err
	}
	k1, k2 := lockkey.Pair(schema + ":setup:" + name)
	var isolation string
	var locked bool
	if err := tx.QueryRow(ctx, q["SetupLock"], k1, k2).Scan(&isolation, &locked); err != nil {
		return false, errors.Wrapf(err, "projection %q: setup lock", name)
	}
	if !locked {
		return false, errors.WithStack(&SetupIsolationError{Projection: name, Isolation: isolation})
	}
	var have int
	switch err := tx.QueryRow(ctx, q["SetupVersion"], name).Scan(&have); {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return false, errors.Wrapf(err, "projection %q: read the setup record", name)
	}
	if have >= v {
		return false, nil
	}
	if err := safely(func() error { return s.Setup(ctx, tx) }); err != nil {
		return false, errors.Wrapf(err, "projection %q: setup version %d", name, v)
	}
	if _, err := tx.Exec(ctx, q["RecordSetup"], name, v, by); err != nil {
		return false, errors.Wrapf(err, "projection %q: record the setup", name)
	}
	return true, nil
}

// setupOf returns the Setupper of a registered projection, or nil.
func setupOf(reg *registration) Setupper {
	if reg.bg != nil {
		return nil // set up per generation, in the generation's schema
	}
	tp, ok := reg.newProc().(*txProcessor)
	if !ok {
		return nil
	}
	s, ok := tp.p.(Setupper)
	if !ok || s.SetupVersion() <= 0 {
		return nil
	}
	return s
}

// Setup runs the setup of every registered projection that has one and
// whose version this database has not recorded (see EnsureSetup), each in a
// transaction of its own. Run and RunUntilCaughtUp call it first; call it
// yourself to have the read models before the runner starts (to serve
// reads at once).
func (r *Runner) Setup(ctx context.Context) error {
	r.mu.Lock()
	regs := append([]*registration(nil), r.regs...)
	r.mu.Unlock()
	for _, reg := range regs {
		s := setupOf(reg)
		if s == nil {
			continue
		}
		err := pgx.BeginTxFunc(ctx, r.pool, pgtx.ReadCommitted, func(tx pgx.Tx) error {
			ran, err := EnsureSetup(ctx, tx, r.cfg.Schema, reg.name, s, r.cfg.InstanceID)
			if ran {
				r.cfg.Logger.InfoContext(ctx, "annals: read model set up", "projection", reg.name, "version", s.SetupVersion())
			}
			return err
		})
		if err != nil {
			return errors.Wrap(err, "projection: setup")
		}
	}
	return nil
}

// setupBeforeReset runs the projection's setup in a rebuild's reset
// transaction, before Reset: a rebuild in a database where the projection
// never ran finds its tables.
func (rb *rebuild) setupBeforeReset(ctx context.Context, tx pgx.Tx) error {
	s := setupOf(rb.reg)
	if s == nil {
		return nil
	}
	_, err := EnsureSetup(ctx, tx, rb.r.cfg.Schema, rb.reg.name, s, rb.r.cfg.InstanceID)
	return err
}
