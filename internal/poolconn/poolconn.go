package poolconn

import (
	"context"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/advisorylock"
)

// ConnectFunc opens a connection with the settings of cc, as
// advisorylock.Config.Connect and catchup's listener take it.
type ConnectFunc = func(ctx context.Context, cc *pgx.ConnConfig) (*pgx.Conn, error)

// closeTimeout bounds closing a connection whose AfterConnect failed.
const closeTimeout = 5 * time.Second

// Hooks are the connection hooks of a pool.
type Hooks struct {
	// BeforeConnect is the pool's BeforeConnect, or nil.
	BeforeConnect func(context.Context, *pgx.ConnConfig) error
	// AfterConnect is the pool's AfterConnect, or nil.
	AfterConnect func(context.Context, *pgx.Conn) error
}

// Of returns pool's hooks and a copy of its ConnConfig.
func Of(pool *pgxpool.Pool) (*pgx.ConnConfig, Hooks) {
	cfg := pool.Config() // a copy
	return cfg.ConnConfig, Hooks{BeforeConnect: cfg.BeforeConnect, AfterConnect: cfg.AfterConnect}
}

// Prepare returns a copy of cc with BeforeConnect run on it: the settings
// of one dial. Callers that cannot run AfterConnect (a replication
// connection speaks another protocol) connect with it themselves.
func (h Hooks) Prepare(ctx context.Context, cc *pgx.ConnConfig) (*pgx.ConnConfig, error) {
	cc = cc.Copy()
	if h.BeforeConnect != nil {
		if err := h.BeforeConnect(ctx, cc); err != nil {
			return nil, errors.Wrap(err, "the pool's BeforeConnect")
		}
	}
	return cc, nil
}

// Connect opens a connection with the settings of cc as the pool opens
// one: BeforeConnect on a copy of cc, then AfterConnect on the connection
// (which is closed if AfterConnect fails). cc is not changed.
func (h Hooks) Connect(ctx context.Context, cc *pgx.ConnConfig) (*pgx.Conn, error) {
	cc, err := h.Prepare(ctx, cc)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, err
	}
	if h.AfterConnect != nil {
		if err := h.AfterConnect(ctx, conn); err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
			defer cancel()
			return nil, errors.CombineErrors(errors.Wrap(err, "the pool's AfterConnect"), conn.Close(cctx))
		}
	}
	return conn, nil
}

// Connect opens one connection outside pool, as pool opens its own.
func Connect(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, error) {
	cc, h := Of(pool)
	return h.Connect(ctx, cc)
}

// LockConfig returns a copy of cfg (nil: defaults) whose Connect opens the
// lock sessions as pool opens its connections, unless cfg names a Connect
// of its own.
func LockConfig(pool *pgxpool.Pool, cfg *advisorylock.Config) *advisorylock.Config {
	var c advisorylock.Config
	if cfg != nil {
		c = *cfg
	}
	if c.Connect == nil {
		_, h := Of(pool)
		c.Connect = h.Connect
	}
	return &c
}

// Replication returns the settings of one logical replication connection
// (replication=database) named application: pool's connection settings
// with its BeforeConnect run on them. Its AfterConnect is not run: it
// expects a session that speaks the ordinary protocol.
func Replication(ctx context.Context, pool *pgxpool.Pool, application string) (*pgconn.Config, error) {
	base, hooks := Of(pool)
	cc, err := hooks.Prepare(ctx, base)
	if err != nil {
		return nil, err
	}
	pc := &cc.Config
	pc.RuntimeParams["replication"] = "database"
	pc.RuntimeParams["application_name"] = application
	return pc, nil
}
