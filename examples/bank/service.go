package main

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/projection"
)

// service is the bank service wired together: one annals client (event
// store, runner, scheduler) with the balances projection and the notifier
// registered, and the accounts repository. The demo and the projections
// commands share it.
type service struct {
	pool     *pgxpool.Pool
	client   *annals.Client
	accounts *aggregate.Repository[*Account]
	mailer   *logMailer
}

// serviceOptions configure the service.
type serviceOptions struct {
	// out receives the notifications.
	out io.Writer
	// logger receives the runner's logs. Defaults to annals' default:
	// warnings and errors on slog.Default().
	logger *slog.Logger
	// pollInterval is the runner's PollInterval. Defaults to the runner's.
	pollInterval time.Duration
}

// newService wires the service on the database at url without touching
// it: the pool connects on first use, and Start migrates.
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
	reg := newRegistry()
	s := &service{pool: pool, mailer: newLogMailer(o.out)}
	if s.client, err = annals.New(pool, &annals.Config{
		Registry: reg,
		Logger:   o.logger,
		// Retry a failing handler quickly in the demo; a service keeps the
		// defaults (3 retries, 1 s, ×2).
		Retry:  &projection.RetryPolicy{MaxRetries: 2, InitialDelay: 100 * time.Millisecond},
		Runner: &projection.Config{PollInterval: o.pollInterval},
	}); err != nil {
		return nil, err
	}
	if s.accounts, err = annals.NewRepository(s.client, "account", newAccount, nil); err != nil {
		return nil, err
	}
	if err := annals.AddProjection(s.client, newBalances(reg), nil); err != nil {
		return nil, err
	}
	if err := annals.AddObserver(s.client, newNotifier(reg, s.mailer), nil); err != nil {
		return nil, err
	}
	return s, nil
}

// errNoDatabase is returned by every command without DATABASE_URL.
var errNoDatabase = errors.New("set DATABASE_URL (or run `make demo`, which starts a throwaway PostgreSQL)")

// Close closes the pool.
func (s *service) Close() { s.pool.Close() }
