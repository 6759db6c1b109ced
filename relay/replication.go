package relay

import (
	"context"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/poolconn"
	"github.com/annals-dev/annals/walsource"
)

// ErrNoReplication is matched by Run's error when Config.WAL is set, the
// WAL source of the relay's leadership has stopped for good
// (walsource.PermanentError) or not started streaming within
// walStartTimeout while its replication slot is not in use, and PostgreSQL
// refuses the relay's own role a replication connection (42501 or 28000):
// the slot could never be streamed from, and the relay would run on
// polling only.
var ErrNoReplication = errors.New("relay: the role may not stream from a replication slot")

// walStartTimeout is how long a leadership's WAL source may take to start
// streaming before the relay looks into why (wakeFor).
const walStartTimeout = 10 * time.Second

// wakeFor returns the engine's WakeFor for Config.WAL: each leadership's
// Waker is the Wake's, watched until it streams. When it has not started
// within walStartTimeout and its slot is not in use, the relay tries a
// replication connection as its own pool makes them; a refusal for the
// role ends Run (abort) with ErrNoReplication.
//
// The check is a real connection, not the role's attributes: a managed
// service grants replication by membership (RDS: rds_replication) while
// rolreplication stays false. And it is made only when the Wake is not
// streaming: the Wake may be built on another pool, as another role, which
// the relay cannot see; a working Wake is never refused.
func (r *Relay) wakeFor(abort func(error)) catchup.WakeFor {
	return func(ctx context.Context, sub *catchup.Subscription, lease *catchup.Lease) (catchup.Waker, func()) {
		w, stop := r.cfg.WAL.For(ctx, sub, lease)
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			err := r.watchWAL(wctx, w, r.cfg.WAL.Slot(sub.Name, sub.Partition))
			if r.onWALCheck != nil && wctx.Err() == nil {
				r.onWALCheck(err)
			}
			if err != nil && wctx.Err() == nil {
				abort(err)
			}
		}()
		return w, func() { cancel(); <-done; stop() }
	}
}

// watchWAL waits for w to stream, up to walStartTimeout (or the relay's
// own setting, for tests), and returns ErrNoReplication when it has not,
// slot is not in use, and the relay's role is refused a replication
// connection. When w's source stops for good before (a
// walsource.PermanentError) it returns at once: ErrNoReplication when the
// relay's role is refused, the source's error otherwise. nil when w
// streams (or ctx ends).
func (r *Relay) watchWAL(ctx context.Context, w catchup.Waker, slot string) error {
	timeout := walStartTimeout
	if r.walStartTimeout > 0 {
		timeout = r.walStartTimeout
	}
	// A WAL source that stopped for good (walsource.PermanentError: a role
	// without REPLICATION, wal_level below logical, ...) says so at once.
	var stopped <-chan struct{}
	sw, _ := w.(walsource.StoppingWaker)
	if sw != nil {
		stopped = sw.Stopped()
	}
	start := time.Now()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.Listening():
		return nil
	case <-ctx.Done():
		return nil
	case <-stopped:
		// The relay's own role may be the one refused (ErrNoReplication), or
		// the Wake's, on another pool, or the server's settings.
		if err := r.probeReplication(ctx, time.Since(start)); err != nil {
			return errors.WithSecondaryError(err, sw.Err())
		}
		return errors.Wrap(sw.Err(), "relay: the WAL source stopped")
	case <-t.C:
	}
	slots, err := walsource.Slots(ctx, r.pool)
	if err == nil {
		for _, s := range slots {
			if s.Slot == slot && s.Active {
				return nil // streaming now, or being created (which waits for running transactions)
			}
		}
	}
	return r.probeReplication(ctx, timeout)
}

// probeReplication opens a replication connection as walsource does (the
// pool's settings and BeforeConnect, replication=database) and runs
// IDENTIFY_SYSTEM. It returns ErrNoReplication only when PostgreSQL refuses
// the role (42501 insufficient_privilege, 28000 invalid authorization, as
// pg_hba answers a replication connection it has no line for); any other
// failure says nothing about the role, and is left to the WAL source's
// retries and log.
func (r *Relay) probeReplication(ctx context.Context, waited time.Duration) error {
	pc, err := poolconn.Replication(ctx, r.pool, "annals relay replication check")
	if err != nil {
		return nil
	}
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err == nil {
		_, err = pglogrepl.IdentifySystem(ctx, conn)
		conn.Close(context.WithoutCancel(ctx))
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" && pgErr.Code != "28000" {
		return nil
	}
	return errors.Wrapf(ErrNoReplication, "the relay's WAL source has not started streaming within %v, and PostgreSQL refuses role %q a replication connection (%s: %s), "+
		"which waking the relay from the WAL needs: give the role the REPLICATION attribute (ALTER ROLE … REPLICATION; on a managed service, its replication role, "+
		"such as rds_replication), or run the relay without the WAL (NOTIFY)", waited, pc.User, pgErr.Code, pgErr.Message)
}
