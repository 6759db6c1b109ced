package hookedpool

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Placeholder is the role a hooked pool's ConnConfig names: it does not
// exist, so a connection that skips BeforeConnect fails to log in.
const Placeholder = "annals_placeholder_role"

// Pool is a pool whose login comes from BeforeConnect; Before and After
// count the calls of its BeforeConnect and AfterConnect hooks.
type Pool struct {
	*pgxpool.Pool
	Before, After *atomic.Int64
}

// New returns a hooked pool on the database at url, whose sessions carry
// name as their application_name (empty: the URL's). The pool is closed
// when the test ends.
func New(t testing.TB, url, name string) Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	user := cfg.ConnConfig.User
	cfg.ConnConfig.User = Placeholder
	if name != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = name
	}
	p := Pool{Before: new(atomic.Int64), After: new(atomic.Int64)}
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		p.Before.Add(1)
		cc.User = user
		return nil
	}
	cfg.AfterConnect = func(context.Context, *pgx.Conn) error {
		p.After.Add(1)
		return nil
	}
	p.Pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Pool.Close)
	return p
}
