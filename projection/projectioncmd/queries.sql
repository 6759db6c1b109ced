-- Statements of the projections command tree.

-- name: Head
SELECT greatest((SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events),
                (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events_archive));

-- name: Checkpoints
-- The subscriber's checkpoint rows with their unresolved dead letters. $1 subscriber.
SELECT c.partition, c.position, c.epoch, coalesce(c.owner, ''), coalesce(c.stopped_reason, ''), c.updated_at,
       (SELECT count(*) FROM {{.Schema}}.dead_letters d
         WHERE d.subscriber_id = c.subscriber_id AND d.partition = c.partition
           AND d.status IN ('open', 'retry'))
  FROM {{.Schema}}.checkpoints c
 WHERE c.subscriber_id = $1
 ORDER BY c.partition;
