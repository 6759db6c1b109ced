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

// Replication's settings are the pool's with its BeforeConnect run, for a
// replication connection under the given name; the pool's own config is
// not changed.
func TestReplication(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig("postgres://placeholder@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.User = "from_before_connect"
		return nil
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pc, err := poolconn.Replication(t.Context(), pool, "annals test")
	if err != nil {
		t.Fatal(err)
	}
	if pc.User != "from_before_connect" || pc.RuntimeParams["replication"] != "database" || pc.RuntimeParams["application_name"] != "annals test" {
		t.Fatalf("user %q, params %v", pc.User, pc.RuntimeParams)
	}
	if c := pool.Config().ConnConfig; c.User != "placeholder" || c.RuntimeParams["replication"] != "" {
		t.Fatalf("the pool's config changed: user %q, params %v", c.User, c.RuntimeParams)
	}
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error { return errors.New("no token") }
	failing, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer failing.Close()
	if _, err := poolconn.Replication(t.Context(), failing, "x"); err == nil {
		t.Fatal("a failing BeforeConnect gave settings")
	}
}
