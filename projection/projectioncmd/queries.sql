-- Statements of the projections command tree.

-- name: Head
SELECT greatest((SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events),
                (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events_archive));

-- name: Checkpoints
-- The subscriber's checkpoint rows with their unresolved dead letters and
-- their heartbeat leader (leadership.HeartbeatLeaderJoin, as `annals
-- status` reads it: a fact, not the leader, which package leadership
-- decides with the lock). $1 subscriber; $2 the staleness threshold in
-- microseconds.
SELECT c.partition, c.position, c.epoch, coalesce(c.owner, ''), coalesce(c.stopped_reason, ''), c.updated_at,
       (SELECT count(*) FROM {{.Schema}}.dead_letters d
         WHERE d.subscriber_id = c.subscriber_id AND d.partition = c.partition
           AND d.status IN ('open', 'retry')),
       coalesce(heartbeat_leader.instance_id, ''), heartbeat_leader.epoch
  FROM {{.Schema}}.checkpoints c
  {{.HeartbeatLeader "c" "$2"}}
 WHERE c.subscriber_id = $1
 ORDER BY c.partition;
