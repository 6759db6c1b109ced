-- Statements of Await (await.go). {{.Schema}} is the quoted schema name.

-- name: AwaitPartition
-- $1 subscriber, $2 position, $3 partitions (0: as many as the subscriber
-- has checkpoint rows), $4 and $5 the partition key (as in the catch-up
-- engine's ReadBatch: stream, category or metadata and its field): the
-- partition of the event at $2 when there are several; 0 when the
-- subscriber is known to have one (not -1: checkpoints of partitions a
-- rebuild to fewer left behind are not waited for); otherwise, or when no
-- event is at $2, -1 (every partition).
SELECT CASE WHEN $3::int = 1 THEN 0 ELSE
       coalesce((SELECT {{.Schema}}.stream_partition(
                            CASE $4::text WHEN 'category' THEN split_part(e.stream_id, '-', 1)
                                          WHEN 'metadata' THEN coalesce(e.metadata ->> $5::text, '')
                                          ELSE e.stream_id END, n.parts)
                   FROM {{.Schema}}.events_all e,
                        (SELECT CASE WHEN $3::int > 0 THEN $3::int
                                     ELSE (SELECT count(*)::int FROM {{.Schema}}.checkpoints WHERE subscriber_id = $1) END AS parts) n
                  WHERE e.global_sequence = $2 AND n.parts > 1), -1) END;

-- name: AwaitCheckpoints
SELECT partition, position FROM {{.Schema}}.checkpoints WHERE subscriber_id = $1;

-- name: AwaitBehind
-- $1 subscriber, $2 target, $3 partition or -1: the partition furthest
-- behind (0 at 0 when there is no checkpoint yet) and how many events lie
-- after its checkpoint up to the target.
SELECT c.partition, c.position,
       (SELECT count(*) FROM {{.Schema}}.events_all e WHERE e.global_sequence > c.position AND e.global_sequence <= $2)
  FROM (SELECT partition, position FROM {{.Schema}}.checkpoints
         WHERE subscriber_id = $1 AND ($3::int < 0 OR partition = $3::int)
        UNION ALL
        SELECT greatest($3::int, 0), 0
         WHERE NOT EXISTS (SELECT 1 FROM {{.Schema}}.checkpoints
                            WHERE subscriber_id = $1 AND ($3::int < 0 OR partition = $3::int))) c
 ORDER BY c.position
 LIMIT 1;

-- name: AwaitLive
-- The live generation of the blue/green projection $1 (its subscriber and
-- version); no row for a projection without generations.
SELECT subscriber, version
  FROM {{.Schema}}.read_model_generations
 WHERE projection = $1 AND state = 'live';

-- name: AwaitCanReadGenerations
-- Whether the role may read read_model_generations (runners may; writers
-- and readers, who await ordinary projections, may not). $1: the schema.
SELECT coalesce(has_table_privilege(to_regclass(format('%I.%I', $1::text, 'read_model_generations')), 'SELECT'), false);
