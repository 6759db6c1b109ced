package projection_test

import (
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// TestDropRetiredDropsOnlyGenerationSchemas: a runner role may write
// read_model_generations (grant.sql, group run), so one service's runner
// could plant a retired generation of another service's blue/green
// projection naming any schema, and that service's janitor
// (DropRetired) dropped it with everything in it, as its own role: an
// audit dropped a "billing" schema holding a table, owned by the victim,
// through a row another runner role inserted. DropRetired drops only the
// schema annals names a generation (rm_<name>_g<N>) and refuses a row
// naming another (ErrForgedGeneration), leaving it as it is.
func TestDropRetiredDropsOnlyGenerationSchemas(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	schema := pgx.Identifier{db.Schema}.Sanitize()
	for _, s := range []string{
		`CREATE SCHEMA billing`,
		`CREATE TABLE billing.invoices (id int)`,
		`INSERT INTO billing.invoices VALUES (1)`,
		`CREATE SCHEMA rm_orders_view_g1`,
		`INSERT INTO ` + schema + `.read_model_generations
		     (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by, retired_at)
		 VALUES ('orders_view', 1, 1, 'rm_orders_view_g1', 'orders', 'orders_view#g1', 'retired', 'test', now() - interval '2 days'),
		        ('orders_view', 99, 1, 'billing', 'orders', 'orders_view#g99', 'retired', 'another runner', now() - interval '1 day')`,
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	dropped, err := projection.DropRetired(ctx, db.Pool, db.Schema, "orders_view", 0)
	if err == nil || !strings.Contains(err.Error(), `"billing"`) || !strings.Contains(err.Error(), "rm_orders_view_g99") {
		t.Errorf("DropRetired: %v, %v; want generation 1 dropped and an error naming billing and rm_orders_view_g99", dropped, err)
	}
	if !errors.Is(err, projection.ErrForgedGeneration) {
		t.Errorf("DropRetired: %v; want ErrForgedGeneration, as the cut-over, the rollback and the runner give", err)
	}
	if len(dropped) != 1 || dropped[0] != 1 {
		t.Errorf("dropped %v, want [1]", dropped)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM billing.invoices`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("billing.invoices after DropRetired: %d rows, %v", n, err)
	}
	var states []string
	rows, _ := db.Pool.Query(ctx, `SELECT state FROM `+schema+`.read_model_generations WHERE projection = 'orders_view' ORDER BY generation`)
	if states, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || strings.Join(states, ",") != "dropped,retired" {
		t.Errorf("states %v, %v; want generation 1 dropped, 99 left retired", states, err)
	}
}
