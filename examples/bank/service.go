package main

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
)

// service is the bank service wired together: the event store, the
// accounts repository and a runner with the balances projection and the
// notifier registered. The demo and the projections commands share it.
type service struct {
	pool     *pgxpool.Pool
	reg      *eventstore.Registry
	store    *eventstore.Store
	accounts *aggregate.Repository[*Account]
	runner   *projection.Runner
	mailer   *logMailer
}

// serviceOptions configure the service.
type serviceOptions struct {
	// out receives the notifications.
	out io.Writer
	// logger receives the runner's logs. Defaults to discarding.
	logger *slog.Logger
	// pollInterval is the runner's PollInterval. Defaults to the runner's.
	pollInterval time.Duration
}

// newService wires the service on the database at url without touching
// it: the pool connects on first use. Call migrate before using it.
func newService(url string, o serviceOptions) (_ *service, err error) {
	if url == "" {
		return nil, errNoDatabase
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		return nil, errors.Wrap(err, "DATABASE_URL")
	}
	defer func() {
		if err != nil {
			pool.Close()
		}
	}()
	s := &service{pool: pool, reg: newRegistry(), mailer: newLogMailer(o.out)}
	if s.store, err = eventstore.New(pool, &eventstore.Config{Registry: s.reg}); err != nil {
		return nil, err
	}
	if s.accounts, err = aggregate.NewRepository(s.store, "account", newAccount, nil); err != nil {
		return nil, err
	}
	if s.runner, err = projection.NewRunner(pool, &projection.Config{
		Logger:       o.logger,
		PollInterval: o.pollInterval,
		// Retry a failing handler quickly in the demo; a service keeps the
		// defaults (3 retries, 1 s, ×2).
		Retry: &projection.RetryPolicy{MaxRetries: 2, InitialDelay: 100 * time.Millisecond},
	}); err != nil {
		return nil, err
	}
	if err := s.runner.Register(newBalances(s.reg), nil); err != nil {
		return nil, err
	}
	if err := s.runner.Register(newNotifier(s.reg, s.mailer), nil); err != nil {
		return nil, err
	}
	return s, nil
}

// errNoDatabase is returned by every command without DATABASE_URL.
var errNoDatabase = errors.New("set DATABASE_URL (or run `make demo`, which starts a throwaway PostgreSQL)")

// migrate creates or upgrades the annals schema (idempotent, safe from many
// processes), then the service's own table.
func (s *service) migrate(ctx context.Context) error {
	if _, err := migrations.Up(ctx, s.pool, nil); err != nil {
		return err
	}
	return createBalancesTable(ctx, s.pool)
}

// Close closes the pool.
func (s *service) Close() { s.pool.Close() }
