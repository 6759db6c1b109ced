package projection_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
)

// runnerRolePool returns a pool of a new login role granted what annals
// grant gives a runner (another service's runner, in these tests); the role
// is dropped when the test ends.
func runnerRolePool(t *testing.T, db *annalstest.DB) *pgxpool.Pool {
	t.Helper()
	ctx := t.Context()
	var b [6]byte
	_, _ = rand.Read(b[:])
	role, pw := "annals_forger_"+hex.EncodeToString(b[:]), "pw-"+hex.EncodeToString(b[:])
	if _, err := db.Pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD '"+pw+"'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := db.Pool.Exec(context.Background(), s); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
	})
	if err := migrations.Grant(ctx, db.Pool, role, migrations.Runner, &migrations.Config{Schema: db.Schema}); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, pw
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // before the role is dropped: cleanups run last first
	return pool
}

// billingSchema makes the schema of another service that the victim's role
// may change: a table and a view, stats, over it.
func billingSchema(t *testing.T, db *annalstest.DB) {
	t.Helper()
	for _, s := range []string{
		`CREATE SCHEMA billing`,
		`CREATE TABLE billing.invoices (stream text PRIMARY KEY, n bigint, total bigint)`,
		`INSERT INTO billing.invoices VALUES ('secret', 1, 1)`,
		`CREATE VIEW billing.stats AS SELECT * FROM billing.invoices`,
	} {
		if _, err := db.Pool.Exec(t.Context(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// untouched checks that billing.stats is still the view over
// billing.invoices, that no view of the reader schema (public) reads
// billing, and that public.stats reads generation live.
func untouched(t *testing.T, db *annalstest.DB, live int) {
	t.Helper()
	ctx := t.Context()
	var def string
	if err := db.Pool.QueryRow(ctx, `SELECT pg_get_viewdef('billing.stats'::regclass)`).Scan(&def); err != nil || !strings.Contains(def, "invoices") {
		t.Errorf("billing.stats is %q (%v); want the view over billing.invoices", def, err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_views WHERE schemaname = 'public' AND definition LIKE '%billing%'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d views of public read billing (%v)", n, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT pg_get_viewdef('public.stats'::regclass)`).Scan(&def); err != nil ||
		!strings.Contains(def, fmt.Sprintf("rm_bgstats_g%d.", live)) {
		t.Errorf("public.stats is %q (%v); want the view over generation %d", def, err, live)
	}
	if s := state(t, db, live); s != projection.GenerationLive {
		t.Errorf("generation %d is %s, want live", live, s)
	}
}

// TestRollbackRefusesForgedGenerations: any runner role may write
// read_model_generations (grant.sql, group run), so another service's
// runner could change the rows of this service's generations, and the
// next Rollback (an operator's, as a role that may change the reader
// schema) pointed views as that role wherever the rows said: at another
// schema's tables (readers of public.stats read billing's invoices through
// a view the victim owns), or replaced another schema's view (billing.stats)
// by one over the read model. Rollback refuses a row naming a schema or
// subscriber annals does not give that generation, and a reader schema that
// holds no view of the generations it swaps, and changes nothing.
func TestRollbackRefusesForgedGenerations(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, forge string }{
		{"the previous generation's schema", `schema_name = 'billing' WHERE generation = 1`},
		{"the previous generation's reader schema", `reader_schema = 'billing' WHERE generation = 1`},
		{"both reader schemas", `reader_schema = 'billing'`},
		{"the live generation's subscriber", `subscriber = 'billing_projector' WHERE generation = 2`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := annalstest.NewDB(t, nil)
			ctx := t.Context()
			seedV1(t, db, &bgLog{db: db}, 3, 2)
			if cut, err := bgRunner(t, db, "v2", 2, false).RebuildBlueGreen(ctx, bgName, nil); err != nil || cut.To != 2 {
				t.Fatalf("cut-over to g2: %+v %v", cut, err)
			}
			billingSchema(t, db)
			forger := runnerRolePool(t, db)
			if _, err := forger.Exec(ctx, `UPDATE `+pgx.Identifier{db.Schema}.Sanitize()+`.read_model_generations SET `+
				strings.Replace(c.forge, "WHERE", "WHERE projection = 'bgstats' AND", 1)); err != nil {
				t.Fatal(err)
			}
			rb, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName)
			if !errors.Is(err, projection.ErrForgedGeneration) {
				t.Errorf("Rollback: %+v, %v; want ErrForgedGeneration", rb, err)
			}
			untouched(t, db, 2)
		})
	}
}

// TestCutoverRefusesForgedGenerations: as TestRollbackRefusesForgedGenerations,
// for a runner's cut-over: another service's runner changes the row of the
// generation being built while it replays, and the cut-over made the views
// where the row said (replacing billing.stats by a view over the new
// generation), or fenced and stopped the subscriber the live generation's
// row named (another service's). The cut-over refuses, changing nothing.
func TestCutoverRefusesForgedGenerations(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, forge string }{
		{"the new generation's reader schema", `reader_schema = 'billing' WHERE generation = 2`},
		{"the new generation's schema", `schema_name = 'billing' WHERE generation = 2`},
		{"the live generation's subscriber", `subscriber = 'billing_projector' WHERE generation = 1`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := annalstest.NewDB(t, nil)
			ctx := t.Context()
			seedV1(t, db, &bgLog{db: db}, 3, 2)
			billingSchema(t, db)
			if _, err := db.Pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{db.Schema}.Sanitize()+`.checkpoints
				(subscriber_id, partition, position, epoch, owner) VALUES ('billing_projector', 0, 0, 1, 'billing')`); err != nil {
				t.Fatal(err)
			}
			forger := runnerRolePool(t, db)
			// The forger strikes while generation 2 replays (its row is
			// committed by then), before the cut-over reads it.
			var once sync.Once
			var forged error
			hook := func(ctx context.Context) {
				once.Do(func() {
					_, forged = forger.Exec(ctx, `UPDATE `+pgx.Identifier{db.Schema}.Sanitize()+`.read_model_generations SET `+
						strings.Replace(c.forge, "WHERE", "WHERE projection = 'bgstats' AND", 1))
				})
			}
			r, err := projection.NewRunner(db.Pool, &projection.Config{InstanceID: "v2"})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Register(hookedStats(hook), &projection.Options{BlueGreen: &projection.BlueGreen{Version: 2}}); err != nil {
				t.Fatal(err)
			}
			cut, err := r.RebuildBlueGreen(ctx, bgName, nil)
			if forged != nil {
				t.Fatalf("forge: %v", forged)
			}
			if !errors.Is(err, projection.ErrForgedGeneration) {
				t.Errorf("RebuildBlueGreen: %+v, %v; want ErrForgedGeneration", cut, err)
			}
			untouched(t, db, 1)
			var stopped *string
			if err := db.Pool.QueryRow(ctx, `SELECT stopped_reason FROM `+pgx.Identifier{db.Schema}.Sanitize()+`.checkpoints
				WHERE subscriber_id = 'billing_projector'`).Scan(&stopped); err != nil || stopped != nil {
				t.Errorf("billing_projector stopped: %v (%v)", stopped, err)
			}
		})
	}
}

// hookedStats is statsProjection(2) whose handler calls hook first.
func hookedStats(hook func(context.Context)) *projection.Typed {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Counted](reg, "bg.counted")
	p := projection.New(bgName, reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE stats (stream text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)`))
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Counted]) error {
		hook(ctx)
		_, err := tx.Exec(ctx, `INSERT INTO stats VALUES ($1, 1, $2)
			ON CONFLICT (stream) DO UPDATE SET n = stats.n + 1, total = stats.total + $2`, e.StreamID, e.Data.V+bgBonus)
		return err
	})
	return p
}

// TestRunnerRefusesForgedGenerations: a runner runs a generation's
// handlers with the schema its row names first on the search_path, so
// another service's runner that changed the live generation's row to name
// its billing schema had this runner's handlers write there, as this
// runner's role (stats resolved to billing.stats, an updatable view over
// billing.invoices). The runner refuses to run a generation whose row names
// another schema than annals gives it.
func TestRunnerRefusesForgedGenerations(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 3, 2)
	billingSchema(t, db)
	if _, err := runnerRolePool(t, db).Exec(ctx, `UPDATE `+pgx.Identifier{db.Schema}.Sanitize()+`.read_model_generations
		SET schema_name = 'billing' WHERE projection = 'bgstats' AND generation = 1`); err != nil {
		t.Fatal(err)
	}
	if err := log.add(ctx, 2, 2); err != nil {
		t.Fatal(err)
	}
	if err := bgRunner(t, db, "v1", 1, false).RunUntilCaughtUp(ctx); !errors.Is(err, projection.ErrForgedGeneration) {
		t.Errorf("RunUntilCaughtUp: %v; want ErrForgedGeneration", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM billing.invoices`).Scan(&n); err != nil || n != 1 {
		t.Errorf("billing.invoices has %d rows (%v); want its 1", n, err)
	}
}
