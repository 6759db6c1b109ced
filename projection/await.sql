-- Statements of Await (await.go). {{.Schema}} is the quoted schema name.

-- name: AwaitPartition
-- $1 subscriber, $2 position: the partition of the event at $2 when the
-- subscriber has several partitions (one checkpoint row each); otherwise,
-- or when no event is at $2, -1 (wait for every partition).
SELECT coalesce((SELECT {{.Schema}}.stream_partition(e.stream_id, n.parts)
                   FROM {{.Schema}}.events e,
                        (SELECT count(*)::int AS parts FROM {{.Schema}}.checkpoints WHERE subscriber_id = $1) n
                  WHERE e.global_sequence = $2 AND n.parts > 1), -1);

-- name: AwaitCheckpoints
SELECT partition, position FROM {{.Schema}}.checkpoints WHERE subscriber_id = $1;

-- name: AwaitBehind
-- $1 subscriber, $2 target, $3 partition or -1: the partition furthest
-- behind (0 at 0 when there is no checkpoint yet) and how many events lie
-- after its checkpoint up to the target.
SELECT c.partition, c.position,
       (SELECT count(*) FROM {{.Schema}}.events e WHERE e.global_sequence > c.position AND e.global_sequence <= $2)
  FROM (SELECT partition, position FROM {{.Schema}}.checkpoints
         WHERE subscriber_id = $1 AND ($3::int < 0 OR partition = $3::int)
        UNION ALL
        SELECT greatest($3::int, 0), 0
         WHERE NOT EXISTS (SELECT 1 FROM {{.Schema}}.checkpoints
                            WHERE subscriber_id = $1 AND ($3::int < 0 OR partition = $3::int))) c
 ORDER BY c.position
 LIMIT 1;
