-- Statements of the command line (`annals status`, `annals checkpoint`),
-- rendered with the schema as {{.Schema}}. `annals status` runs Head,
-- Subscribers and Instances in one read-only REPEATABLE READ transaction, so
-- they see one snapshot and one now().

-- name: Head
-- The head of the log (0 when empty) and the server's clock.
SELECT greatest((SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events),
                (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events_archive)), now();

-- name: Subscribers
-- One row per subscriber partition. $1: staleness threshold in microseconds
-- (an instance with an older heartbeat is not a live leader); $2: how many
-- lagging events to count at most (the count stops at $2 + 1).
--
-- lag_events counts the events after the checkpoint, so holes left by
-- rolled-back appends do not inflate it; it is bounded, one index range scan
-- of at most $2 + 1 entries per partition. lag_seconds is the age of the
-- oldest unprocessed event (0 when caught up). The heartbeat leader
-- (leadership.HeartbeatLeaderJoin) is a fact, not the leader, which package
-- leadership decides with the lock (leadership.LockStates).
SELECT c.subscriber_id, c.partition, c.position, c.epoch, c.owner, c.updated_at,
       lag.events,
       coalesce(greatest(0, extract(epoch FROM now() - oldest.recorded_at))::float8, 0),
       heartbeat_leader.instance_id, heartbeat_leader.epoch, c.stopped_reason, c.stopped_at,
       (SELECT count(*) FROM {{.Schema}}.dead_letters d
         WHERE d.subscriber_id = c.subscriber_id AND d.partition = c.partition
           AND d.status IN ('open', 'retry'))
  FROM {{.Schema}}.checkpoints c
 CROSS JOIN LATERAL (
        SELECT count(*) AS events
          FROM (SELECT 1
                  FROM {{.Schema}}.events_all e
                 WHERE e.global_sequence > c.position
                 ORDER BY e.global_sequence
                 LIMIT $2::bigint + 1) AS capped
       ) AS lag
  LEFT JOIN LATERAL (
        SELECT e.recorded_at
          FROM {{.Schema}}.events_all e
         WHERE e.global_sequence > c.position
         ORDER BY e.global_sequence
         LIMIT 1
       ) AS oldest ON true
  {{.HeartbeatLeader "c" "$1"}}
 ORDER BY c.subscriber_id, c.partition;

-- name: Instances
-- Every registered runner instance. $1: staleness threshold in microseconds.
SELECT instance_id, host, pid, started_at, last_heartbeat,
       CASE WHEN jsonb_typeof(leads) = 'array' THEN leads ELSE '[]'::jsonb END,
       last_heartbeat > now() - $1::bigint * interval '1 microsecond',
       greatest(0, extract(epoch FROM now() - last_heartbeat))::float8
  FROM {{.Schema}}.instances
 ORDER BY instance_id;

-- name: SubscriberLayout
-- The partition count recorded for a subscriber (no row: none recorded).
SELECT partitions FROM {{.Schema}}.subscriber_layouts WHERE subscriber_id = $1;

-- name: Audit
-- One entry of the audit trail for a CLI action; the trigger stamps its ID,
-- time and database role (as for the console's actions).
INSERT INTO {{.Schema}}.audit_log (actor, action, target, detail)
VALUES ($1, $2, $3, $4);

-- name: CanReadGenerations
-- Whether the role may read read_model_generations (a role granted by an
-- older annals grant may not).
-- $1: the schema's name.
SELECT coalesce(has_table_privilege(to_regclass(format('%I.%I', $1::text, 'read_model_generations')), 'SELECT'), false);

-- name: Generations
-- The blue/green generations of read models that are not dropped, by
-- subscriber.
SELECT g.subscriber, g.projection, g.generation, g.state
  FROM {{.Schema}}.read_model_generations g
 WHERE g.state <> 'dropped';

-- name: CanReadKinds
-- Whether the role may read subscriber_layouts, where the runner records
-- each subscriber's kind (a role granted by an older annals may not).
-- $1: the schema's name.
SELECT coalesce(has_table_privilege(to_regclass(format('%I.%I', $1::text, 'subscriber_layouts')), 'SELECT'), false);

-- name: Kinds
-- The kind the runner recorded for each subscriber (migration 0044), read
-- through the row's JSON so that a schema before 0044, without the column,
-- answers no kinds instead of failing the status's transaction.
SELECT l.subscriber_id, to_jsonb(l) ->> 'kind'
  FROM {{.Schema}}.subscriber_layouts l
 WHERE to_jsonb(l) ->> 'kind' IS NOT NULL;

-- name: CanAudit
-- Whether the role may write the audit log: NULL when there is none (the
-- schema is not migrated: the action's own statements say so). $1: the
-- schema's name.
SELECT has_table_privilege(to_regclass(format('%I.%I', $1::text, 'audit_log')), 'INSERT');

-- name: AuditProbe
-- Fails as PostgreSQL does when the schema has no audit_log table.
SELECT FROM {{.Schema}}.audit_log LIMIT 0;
