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

-- name: HeartbeatLeaders
-- For each partition of subscriber $1 that a live instance's heartbeat
-- lists (live: a heartbeat within $2 microseconds), that instance and the
-- epoch it lists, preferring one at the checkpoint's epoch, as `annals
-- status` reads its heartbeat leader: a fact, not the leader, which
-- package leadership decides with the lock.
SELECT DISTINCT ON (l.partition) l.partition, i.instance_id, l.epoch
  FROM {{.Schema}}.instances i
 CROSS JOIN LATERAL (
        SELECT (x -> 'partition')::numeric::int AS partition,
               max(CASE WHEN jsonb_typeof(x -> 'epoch') = 'number' THEN (x -> 'epoch')::numeric END)::bigint AS epoch
          FROM jsonb_array_elements(CASE WHEN jsonb_typeof(i.leads) = 'array' THEN i.leads ELSE '[]'::jsonb END) AS x
         WHERE jsonb_typeof(x) = 'object' AND x -> 'subscriber' = to_jsonb($1::text)
           AND jsonb_typeof(x -> 'partition') = 'number' AND (x -> 'partition')::numeric % 1 = 0
           AND abs((x -> 'partition')::numeric) < 2147483648
         GROUP BY 1
       ) AS l
  LEFT JOIN {{.Schema}}.checkpoints c ON c.subscriber_id = $1 AND c.partition = l.partition
 WHERE i.last_heartbeat > now() - $2::bigint * interval '1 microsecond'
 ORDER BY l.partition, l.epoch IS NOT DISTINCT FROM c.epoch DESC, i.last_heartbeat DESC, i.instance_id;
