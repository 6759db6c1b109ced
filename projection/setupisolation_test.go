package projection_test

// Tests of read-model setup when the session's default isolation is not
// READ COMMITTED: EnsureSetup's lock only makes the second of two
// concurrent starts find the first one's record if the statement after the
// lock takes a new snapshot. Under a REPEATABLE READ default the runner and
// a rebuild ran the setup a second time (and failed on its CREATE TABLE);
// they now begin their setup transactions READ COMMITTED, and EnsureSetup
// refuses a caller's transaction that is not.

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/projection"
)

// repeatableReadDB is newSetupDB whose new sessions default to REPEATABLE
// READ; it returns a function making pools of such sessions, as another
// process's.
func repeatableReadDB(t *testing.T) (*annalstest.DB, *eventstore.Registry, func() *pgxpool.Pool) {
	t.Helper()
	db, reg, _ := newSetupDB(t)
	db.SetDefaultIsolation(t, "repeatable read")
	return db, reg, func() *pgxpool.Pool { t.Helper(); return db.NewPool(t) }
}

// heldSetupProjection is su.balances with a setup that counts its runs and
// creates su_balances with a plain CREATE TABLE; its first run holds its
// transaction open until another session waits for the projection's setup
// lock, so that a second start always meets the first one's setup.
func heldSetupProjection(t *testing.T, db *annalstest.DB, reg *eventstore.Registry, runs *atomic.Int32) *projection.Typed {
	p := projection.New("su.balances", reg)
	p.OnSetup(1, func(ctx context.Context, tx pgx.Tx) error {
		if runs.Add(1) == 1 {
			if err := waitForSetupWaiter(ctx, db, "su.balances"); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `CREATE TABLE su_balances (account text PRIMARY KEY, amount bigint NOT NULL)`)
		return err
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[setupDeposited]) error {
		_, err := tx.Exec(ctx, `INSERT INTO su_balances VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET amount = su_balances.amount + $2`, e.StreamID, e.Data.Amount)
		return err
	})
	p.OnReset(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `TRUNCATE su_balances`)
		return err
	})
	return p
}

// waitForSetupWaiter polls pg_locks until a session of db waits for the
// setup lock of the projection name (projection.EnsureSetup's key).
func waitForSetupWaiter(ctx context.Context, db *annalstest.DB, name string) error {
	k1, k2 := lockkey.Pair(db.Schema + ":setup:" + name)
	return annalstest.WaitForLockWaiter(ctx, db.Pool, k1, k2)
}

func TestSetupUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()

	// Two instances, each with its own pool, start at once: the first holds
	// its setup until the second waits for the lock. The second finds the
	// first one's record and runs nothing; before, its snapshot (taken
	// before the wait) did not show the record, and it ran the setup again
	// and failed on CREATE TABLE.
	for _, second := range []string{"Setup", "RunUntilCaughtUp", "Rebuild"} {
		t.Run("RunnerSetupAnd"+second, func(t *testing.T) {
			t.Parallel()
			db, reg, newPool := repeatableReadDB(t)
			var runs atomic.Int32
			runners := make([]*projection.Runner, 2)
			for i := range runners {
				r, err := projection.NewRunner(newPool(), nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Register(heldSetupProjection(t, db, reg, &runs), nil); err != nil {
					t.Fatal(err)
				}
				runners[i] = r
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			errs := make([]error, 2)
			wg.Add(2)
			go func() { defer wg.Done(); errs[0] = runners[0].Setup(ctx) }()
			go func() {
				defer wg.Done()
				switch second {
				case "Setup":
					errs[1] = runners[1].Setup(ctx)
				case "RunUntilCaughtUp":
					errs[1] = runners[1].RunUntilCaughtUp(ctx)
				case "Rebuild":
					errs[1] = runners[1].Rebuild(ctx, "su.balances", nil)
				}
			}()
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("instance %d: %v", i, err)
				}
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("the setup ran %d times; want once", n)
			}
		})
	}

	// EnsureSetup called with the caller's REPEATABLE READ or SERIALIZABLE
	// transaction fails with a *SetupIsolationError, without running the
	// setup or taking the lock; a READ COMMITTED one runs it, whatever the
	// session's default.
	t.Run("CallersTransaction", func(t *testing.T) {
		t.Parallel()
		db, reg, newPool := repeatableReadDB(t)
		pool := newPool()
		var runs atomic.Int32
		p := projection.New("su.direct", reg)
		p.OnSetup(1, func(ctx context.Context, tx pgx.Tx) error {
			runs.Add(1)
			_, err := tx.Exec(ctx, `CREATE TABLE su_direct (id int)`)
			return err
		})
		for _, tc := range []struct {
			opts pgx.TxOptions
			want string
		}{
			{pgx.TxOptions{}, "repeatable read"}, // the database's default
			{pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, "repeatable read"},
			{pgx.TxOptions{IsoLevel: pgx.Serializable}, "serializable"},
		} {
			err := pgx.BeginTxFunc(t.Context(), pool, tc.opts, func(tx pgx.Tx) error {
				ran, err := projection.EnsureSetup(t.Context(), tx, db.Schema, "su.direct", p, "test")
				if ran {
					t.Errorf("%s: EnsureSetup reports that the setup ran", tc.want)
				}
				var locks int
				if err := tx.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks
					WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&locks); err != nil || locks != 0 {
					t.Errorf("%s: advisory locks held after the refusal = %d, %v; want 0", tc.want, locks, err)
				}
				return err
			})
			var iso *projection.SetupIsolationError
			if !errors.Is(err, projection.ErrSetupIsolation) || !errors.As(err, &iso) ||
				iso.Isolation != tc.want || iso.Projection != "su.direct" {
				t.Fatalf("EnsureSetup in a %s transaction = %v; want a *SetupIsolationError", tc.want, err)
			}
		}
		if n := runs.Load(); n != 0 {
			t.Fatalf("the setup ran %d times in refused transactions", n)
		}
		err := pgx.BeginTxFunc(t.Context(), pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			ran, err := projection.EnsureSetup(t.Context(), tx, db.Schema, "su.direct", p, "test")
			if err == nil && !ran {
				t.Error("EnsureSetup in a READ COMMITTED transaction did not run the setup")
			}
			return err
		})
		if err != nil || runs.Load() != 1 {
			t.Fatalf("EnsureSetup in a READ COMMITTED transaction = %v, %d runs; want nil, 1", err, runs.Load())
		}
	})
}
