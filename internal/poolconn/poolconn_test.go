package poolconn_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/poolconn"
)

func TestMain(m *testing.M) { annalstest.Main(m) }

func TestConnect(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	user := cfg.ConnConfig.User
	cfg.ConnConfig.User = "annals_placeholder_role"
	var afterErr error
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.User = user
		cc.RuntimeParams["application_name"] = "from-before-connect"
		return nil
	}
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if afterErr != nil {
			return afterErr
		}
		_, err := conn.Exec(ctx, `SET search_path = from_after_connect`)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	conn, err := poolconn.Connect(ctx, pool)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	var app, path string
	if err := conn.QueryRow(ctx, `SELECT current_setting('application_name'), current_setting('search_path')`).Scan(&app, &path); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	if app != "from-before-connect" || path != "from_after_connect" {
		t.Fatalf("application_name %q, search_path %q: the hooks did not run", app, path)
	}
	if u := pool.Config().ConnConfig.User; u != "annals_placeholder_role" {
		t.Fatalf("the pool's ConnConfig changed: user %q", u)
	}

	// LockConfig keeps a Connect of the caller's.
	mine := func(context.Context, *pgx.ConnConfig) (*pgx.Conn, error) { return nil, errors.New("mine") }
	if _, err := poolconn.LockConfig(pool, &advisorylock.Config{Connect: mine}).Connect(ctx, nil); err == nil || err.Error() != "mine" {
		t.Fatalf("LockConfig replaced the caller's Connect: %v", err)
	}

	afterErr = errors.New("after connect refused")
	if _, err := poolconn.Connect(ctx, pool); !errors.Is(err, afterErr) {
		t.Fatalf("Connect with a failing AfterConnect = %v", err)
	}
}
