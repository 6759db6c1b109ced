package leadership

import (
	"context"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
)

// heartbeatLeaderJoin is the heartbeat leader of a checkpoint row, written
// once for every caller (see HeartbeatLeaderJoin). Placeholders: SCHEMA
// (a quoted identifier), CP (the checkpoint row's alias), STALE (the
// staleness threshold in microseconds, an SQL expression).
const heartbeatLeaderJoin = `LEFT JOIN LATERAL (
        SELECT li.instance_id, li.epoch
          FROM (SELECT i.instance_id, i.last_heartbeat,
                       (SELECT max((x -> 'epoch')::numeric)::bigint
                          FROM pg_catalog.jsonb_array_elements(i.leads) AS x
                         WHERE x @> pg_catalog.jsonb_build_object('subscriber', CP.subscriber_id, 'partition', CP.partition)
                           AND pg_catalog.jsonb_typeof(x -> 'epoch') = 'number') AS epoch
                  FROM SCHEMA.instances i
                 WHERE i.last_heartbeat > pg_catalog.now() - (STALE)::bigint * interval '1 microsecond'
                   AND pg_catalog.jsonb_typeof(i.leads) = 'array'
                   AND i.leads @> pg_catalog.jsonb_build_array(
                           pg_catalog.jsonb_build_object('subscriber', CP.subscriber_id, 'partition', CP.partition))
               ) AS li
         ORDER BY li.epoch IS NOT DISTINCT FROM CP.epoch DESC, li.last_heartbeat DESC, li.instance_id
         LIMIT 1
       ) AS heartbeat_leader ON true`

// HeartbeatLeaderJoin returns the FROM-clause item that reads the heartbeat
// leader of each row of a query over the checkpoints table (aliased
// checkpoint): the live instance (a heartbeat younger than staleMicros, an
// SQL expression such as "$1") whose heartbeat lists the row's subscriber
// partition, preferring one that lists the checkpoint's epoch, then the
// freshest heartbeat. It joins as heartbeat_leader, with the columns
// instance_id and epoch (the epoch its heartbeat lists; NULL: none), both
// NULL when no live instance lists the partition. That is the
// Facts.HeartbeatLeader and HeartbeatEpoch of the row, not its leader:
// Leader decides that with the lock. schema must be a quoted identifier;
// checkpoint and staleMicros come from the SQL templates, never from input.
// SQL templates call it as {{.HeartbeatLeader "c" "$1"}}.
func HeartbeatLeaderJoin(schema, checkpoint, staleMicros string) string {
	return strings.NewReplacer("SCHEMA", schema, "CP.", checkpoint+".", "STALE", staleMicros).Replace(heartbeatLeaderJoin)
}

// lockStates reads which of the two-int4 advisory keys in the arrays $1
// (k1) and $2 (k2) a session holds exclusively (a partition's leader), and
// that session's backend pid: the 1-based positions of the held ones.
// pg_locks is live (not part of a transaction's snapshot) and readable by
// every role.
const lockStates = `SELECT k.i, l.pid
  FROM unnest($1::int4[], $2::int4[]) WITH ORDINALITY AS k(k1, k2, i)
  JOIN pg_catalog.pg_locks l
    ON l.locktype = 'advisory' AND l.objsubid = 2 AND l.mode = 'ExclusiveLock' AND l.granted
   AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
   AND l.classid = (k.k1::int8 & 4294967295)::oid AND l.objid = (k.k2::int8 & 4294967295)::oid`

// Querier is what LockStates reads with: a pool, a connection or a
// transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Lock is the live state of one partition's advisory lock: Facts.LockHeld,
// and the backend pid of the session that holds it.
type Lock struct {
	Held bool
	PID  int32
}

// LockStates reads, live from pg_locks, the state of each partition's
// advisory lock, whose keys are k1[i], k2[i] (lockkey.Pair of the
// partition's catchup.LockKey): one Lock per key, in order.
func LockStates(ctx context.Context, db Querier, k1, k2 []int32) ([]Lock, error) {
	if len(k1) != len(k2) {
		return nil, errors.AssertionFailedf("leadership: %d first keys, %d second keys", len(k1), len(k2))
	}
	out := make([]Lock, len(k1))
	if len(k1) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, lockStates, k1, k2)
	if err != nil {
		return nil, errors.Wrap(err, "read the advisory locks")
	}
	var (
		i   int
		pid int32
	)
	_, err = pgx.ForEachRow(rows, []any{&i, &pid}, func() error {
		if i >= 1 && i <= len(out) {
			out[i-1] = Lock{Held: true, PID: pid}
		}
		return nil
	})
	if err != nil {
		return nil, errors.Wrap(err, "read the advisory locks")
	}
	return out, nil
}
