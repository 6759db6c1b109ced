package standby

import (
	"context"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
)

// query reads pg_stat_replication: the replay lag in bytes of WAL (NULL on
// a server that is itself a standby, where pg_current_wal_lsn() fails, and
// when the LSN is hidden) and PostgreSQL's replay_lag (NULL once the
// standby is idle and caught up: it is measured as WAL flows).
const query = `
SELECT r.pid, r.application_name, host(r.client_addr), r.state, r.sync_state,
       CASE WHEN r.replay_lsn IS NULL OR pg_catalog.pg_is_in_recovery() THEN NULL
            ELSE pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), r.replay_lsn)::bigint END,
       extract(epoch FROM r.replay_lag)::float8
  FROM pg_catalog.pg_stat_replication r
 WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_replication_slots s
                    WHERE s.active_pid = r.pid AND s.slot_type = 'logical')
 ORDER BY r.application_name, r.pid`

// Standby is one physical standby streaming from the server. Its details
// are nil for a role without pg_read_all_stats (PostgreSQL shows it only
// the walsender's PID).
type Standby struct {
	// PID is the walsender's backend on this server.
	PID int32 `json:"pid"`
	// ApplicationName is the standby's application_name (its cluster_name
	// or the name in its primary_conninfo).
	ApplicationName *string `json:"application_name"`
	// ClientAddr is the standby's address (nil over a Unix socket).
	ClientAddr *string `json:"client_addr"`
	// State is the walsender's state: startup, catchup, streaming, backup
	// or stopping.
	State *string `json:"state"`
	// SyncState is async, potential, sync or quorum.
	SyncState *string `json:"sync_state"`
	// ReplayLagBytes is the WAL written on this server that the standby
	// has not replayed yet (nil: hidden, or this server is itself a
	// standby).
	ReplayLagBytes *int64 `json:"replay_lag_bytes"`
	// ReplayLagSeconds is PostgreSQL's replay_lag: how long the newest WAL
	// the standby has replayed took to get there (nil once idle and caught
	// up, and when hidden).
	ReplayLagSeconds *float64 `json:"replay_lag_seconds"`
}

// Hidden reports a standby whose details PostgreSQL hides from the role
// (it lacks pg_read_all_stats).
func (s Standby) Hidden() bool { return s.State == nil }

// LagSeconds is the replay lag in seconds as status and the console show
// it: replay_lag, or 0 for a standby caught up and idle (PostgreSQL
// measures replay_lag only as WAL flows); nil when unknown.
func (s Standby) LagSeconds() *float64 {
	if s.ReplayLagSeconds != nil {
		return s.ReplayLagSeconds
	}
	if s.ReplayLagBytes != nil && *s.ReplayLagBytes == 0 {
		zero := 0.0
		return &zero
	}
	return nil
}

// DB is what List reads on: a pool, a connection or a transaction.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// List reads the physical standbys streaming from the server, ordered by
// application name and PID; none is an empty (non-nil) slice.
func List(ctx context.Context, db DB) ([]Standby, error) {
	rows, err := db.Query(ctx, query)
	if err != nil {
		return nil, errors.Wrap(err, "read the standbys (pg_stat_replication)")
	}
	out := []Standby{}
	var sb Standby
	_, err = pgx.ForEachRow(rows, []any{&sb.PID, &sb.ApplicationName, &sb.ClientAddr, &sb.State, &sb.SyncState,
		&sb.ReplayLagBytes, &sb.ReplayLagSeconds}, func() error {
		out = append(out, sb)
		sb = Standby{} // the pointers must not be shared
		return nil
	})
	return out, errors.Wrap(err, "read the standbys (pg_stat_replication)")
}
