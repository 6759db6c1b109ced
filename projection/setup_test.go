package projection_test

// Tests of read-model setup (Typed.OnSetup, Runner.Setup, EnsureSetup):
// concurrent starts run it once, a version bump runs the new setup once, a
// rebuild on a database where the projection never ran sets it up before
// Reset, and a failed setup records nothing and stops the start.

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

type setupDeposited struct {
	Amount int `json:"amount"`
}

// setupProjection keeps su_balances; its setup (version v) creates the
// table with a plain CREATE TABLE, which fails if it ever runs twice or
// concurrently, and logs each run into su_log (made by the test).
func setupProjection(reg *eventstore.Registry, v int, extra ...string) *projection.Typed {
	p := projection.New("su.balances", reg)
	stmts := append([]string{
		`SELECT pg_sleep(0.2)`, // widen the window in which a second start would run it too
		`CREATE TABLE su_balances (account text PRIMARY KEY, amount bigint NOT NULL)`,
	}, extra...)
	if v > 1 {
		stmts = extra // the upgrade runs over version 1's table
	}
	stmts = append(stmts, `INSERT INTO su_log (version) VALUES (`+string(rune('0'+v))+`)`)
	p.OnSetup(v, projection.Statements(stmts...))
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

func newSetupDB(t *testing.T) (*annalstest.DB, *eventstore.Registry, *eventstore.Store) {
	t.Helper()
	db := annalstest.NewDB(t, nil)
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[setupDeposited](reg, "su.deposited")
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(t.Context(), `CREATE TABLE su_log (version int NOT NULL, at timestamptz DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := store.Append(t.Context(), "acct-"+string(rune('a'+i)), eventstore.Any,
			eventstore.NewEvent(setupDeposited{Amount: 10})); err != nil {
			t.Fatal(err)
		}
	}
	return db, reg, store
}

func setupRuns(t *testing.T, db *annalstest.DB) map[int]int {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `SELECT version, count(*)::int FROM su_log GROUP BY version`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int{}
	for rows.Next() {
		var v, n int
		if err := rows.Scan(&v, &n); err != nil {
			t.Fatal(err)
		}
		out[v] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func newSetupRunner(t *testing.T, db *annalstest.DB, p projection.Projection) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(p, nil); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestSetup(t *testing.T) {
	t.Parallel()

	// Four instances start at once (Run and RunUntilCaughtUp both set up):
	// the setup runs once, none fails, and the projection then works.
	t.Run("ConcurrentStartsRunItOnce", func(t *testing.T) {
		t.Parallel()
		db, reg, _ := newSetupDB(t)
		const n = 4
		var wg sync.WaitGroup
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range n {
			r := newSetupRunner(t, db, setupProjection(reg, 1))
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if i%2 == 0 {
					errs[i] = r.Setup(t.Context())
				} else {
					errs[i] = r.RunUntilCaughtUp(t.Context())
				}
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("instance %d: %v", i, err)
			}
		}
		if got := setupRuns(t, db); got[1] != 1 || len(got) != 1 {
			t.Fatalf("setup runs by version = %v, want {1:1}", got)
		}
		var total int64
		if err := db.Pool.QueryRow(t.Context(), `SELECT coalesce(sum(amount), 0) FROM su_balances`).Scan(&total); err != nil || total != 30 {
			t.Fatalf("su_balances total = %d, %v; want 30", total, err)
		}
		// A later start finds the record and runs nothing.
		if err := newSetupRunner(t, db, setupProjection(reg, 1)).RunUntilCaughtUp(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got := setupRuns(t, db); got[1] != 1 {
			t.Fatalf("a restart ran the setup again: %v", got)
		}
	})

	// Bumping the version runs the new setup once over the old read model.
	t.Run("VersionBumpRunsOnce", func(t *testing.T) {
		t.Parallel()
		db, reg, _ := newSetupDB(t)
		if err := newSetupRunner(t, db, setupProjection(reg, 1)).RunUntilCaughtUp(t.Context()); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			p := setupProjection(reg, 2, `ALTER TABLE su_balances ADD COLUMN note text`)
			if err := newSetupRunner(t, db, p).RunUntilCaughtUp(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		if got := setupRuns(t, db); got[1] != 1 || got[2] != 1 {
			t.Fatalf("setup runs by version = %v, want {1:1 2:1}", got)
		}
		// An older binary (version 1) still starts: a newer setup is recorded.
		if err := newSetupRunner(t, db, setupProjection(reg, 1)).RunUntilCaughtUp(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got := setupRuns(t, db); got[1] != 1 {
			t.Fatalf("version 1 ran again after version 2: %v", got)
		}
	})

	// A rebuild in a database where the projection never ran sets the read
	// model up before Reset (whose TRUNCATE needs the table).
	t.Run("BeforeRebuild", func(t *testing.T) {
		t.Parallel()
		db, reg, _ := newSetupDB(t)
		r := newSetupRunner(t, db, setupProjection(reg, 1))
		if err := r.Rebuild(t.Context(), "su.balances", nil); err != nil {
			t.Fatal(err)
		}
		var total int64
		if err := db.Pool.QueryRow(t.Context(), `SELECT sum(amount) FROM su_balances`).Scan(&total); err != nil || total != 30 {
			t.Fatalf("after the rebuild su_balances total = %d, %v; want 30", total, err)
		}
		if got := setupRuns(t, db); got[1] != 1 {
			t.Fatalf("setup runs = %v, want {1:1}", got)
		}
	})

	// A failing setup records nothing, the runner does not start, and
	// the next start runs it again.
	t.Run("FailureRecordsNothing", func(t *testing.T) {
		t.Parallel()
		db, reg, _ := newSetupDB(t)
		bad := setupProjection(reg, 1, `SELECT 1/0`)
		err := newSetupRunner(t, db, bad).Run(t.Context())
		if err == nil || !containsAll(err.Error(), "su.balances", "setup version 1", "division by zero") {
			t.Fatalf("Run with a failing setup = %v", err)
		}
		var n int
		if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM annals.read_model_setups`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("setup records = %d, %v; want 0", n, err)
		}
		if err := newSetupRunner(t, db, setupProjection(reg, 1)).RunUntilCaughtUp(t.Context()); err != nil {
			t.Fatalf("a good setup after a failed one: %v", err)
		}
	})

	t.Run("BadVersion", func(t *testing.T) {
		t.Parallel()
		p := projection.New("su.bad", eventstore.NewRegistry())
		p.OnSetup(0, projection.Statements("SELECT 1"))
		r, err := projection.NewRunner(annalstest.NewDB(t, nil).Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(p, nil); err == nil || !strings.Contains(err.Error(), "OnSetup(0") {
			t.Fatalf("Register after OnSetup(0, …) = %v", err)
		}
	})
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
