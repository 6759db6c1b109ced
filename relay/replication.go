package relay

import (
	"context"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
)

// ErrNoReplication is matched by Run and CatchUp when Config.WAL is set and
// the relay's role has neither the REPLICATION attribute nor superuser:
// the replication slot could never be streamed from (PostgreSQL refuses the
// connection), and the relay would retry for ever.
var ErrNoReplication = errors.New("relay: the role may not stream from a replication slot")

// checkReplication fails with ErrNoReplication unless the relay's role may
// stream logical replication.
func (r *Relay) checkReplication(ctx context.Context) error {
	q, err := r.queries()
	if err != nil {
		return err
	}
	var can bool
	var role string
	if err := r.pool.QueryRow(ctx, q["CanReplicate"]).Scan(&can, &role); err != nil {
		return errors.Wrap(err, "relay: read the role's attributes")
	}
	if !can {
		return errors.Wrapf(ErrNoReplication, "role %q has neither REPLICATION nor superuser, which waking the relay from the WAL needs: "+
			"ALTER ROLE %s REPLICATION, or run the relay without the WAL (NOTIFY)", role, pgx.Identifier{role}.Sanitize())
	}
	return nil
}
