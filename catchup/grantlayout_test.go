package catchup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
)

// A runner whose role was granted by an annals older than migration 0022
// lacks subscriber_layouts: after the upgrade, the runner's first statement
// on it (CheckLayout, which Run, CatchUp and every runner start call) is
// refused. The error says what to run, and matches eventstore.ErrNotGranted,
// rather than leaving the operator with PostgreSQL's "permission denied for
// table subscriber_layouts" (operator trial 6: an upgrade from 0020).
func TestCheckLayoutWithoutTheRunnersGrantsSaysSo(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	role := fmt.Sprintf("old_runner_%d", time.Now().UnixNano())
	if _, err := db.Pool.Exec(ctx, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Pool.Exec(context.Background(), `DROP OWNED BY `+pgx.Identifier{role}.Sanitize()+`; DROP ROLE `+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Errorf("dropping the role: %v", err)
		}
	})
	if err := migrations.Grant(ctx, db.Pool, role, migrations.Runner, nil); err != nil {
		t.Fatal(err)
	}
	// What an annals grant before migration 0022 left the role without.
	if _, err := db.Pool.Exec(ctx, `REVOKE ALL ON annals.subscriber_layouts FROM `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET ROLE `+pgx.Identifier{role}.Sanitize())
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e, err := catchup.NewEngine(pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = e.CheckLayout(ctx, &catchup.Subscription{Name: "balances", Processor: nopProcessor{}})
	if err == nil {
		t.Fatal("CheckLayout succeeded without SELECT on subscriber_layouts")
	}
	t.Log(err)
	if !errors.Is(err, eventstore.ErrNotGranted) {
		t.Errorf("err = %v, want it to match eventstore.ErrNotGranted", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "annals grant runner") || !strings.Contains(msg, "subscriber_layouts") {
		t.Errorf("err = %q, want it to say to run 'annals grant runner' and name the table", msg)
	}
}
