package projection

import (
	"context"
	_ "embed"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/internal/lockkey"
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

// EnsureSetup runs s.Setup in tx for the projection name unless the
// schema's read_model_setups table records version s.SetupVersion() (or a
// later one) for it, and records the version. It first takes a
// transaction-scoped advisory lock on the key schema + ":setup:" + name, so
// processes that start at once run the setup once between them, never
// concurrently: the others wait for the first one's commit, then find its
// record. The setup, its record and whatever else tx does commit together;
// a failed setup records nothing. It reports whether Setup ran.
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
	if _, err := tx.Exec(ctx, q["SetupLock"], k1, k2); err != nil {
		return false, errors.Wrapf(err, "projection %q: setup lock", name)
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
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
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
