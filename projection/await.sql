-- Statements of Await (await.go). {{.Schema}} is the quoted schema name.

-- name: AwaitPartition
-- $1 subscriber, $2 position, $3 partitions and $4 partition key as the
-- caller knows them (0 and '': unknown; the key as recorded: stream,
-- category or metadata:FIELD). The subscriber's recorded layout
-- (subscriber_layouts: what its checkpoints were written under) wins over
-- both; without one, an unknown count is the number of the subscriber's
-- checkpoint rows. Returns the partition of the event at $2, computed with
-- the catch-up engine's key (ReadBatch); 0 when the subscriber is known to
-- have one partition (not -1: checkpoints of partitions a rebuild to fewer
-- left behind are not waited for); otherwise -1 (every partition) when no
-- event is at $2 or the key is unknown.
SELECT CASE WHEN k.parts <= 1 AND k.known THEN 0
            WHEN k.parts <= 1 OR k.by = '' THEN -1 ELSE
       coalesce((SELECT {{.Schema}}.stream_partition(
                            CASE WHEN k.by = 'category' THEN split_part(e.stream_id, '-', 1)
                                 WHEN k.by LIKE 'metadata:%' THEN coalesce(e.metadata ->> substr(k.by, 10), '')
                                 ELSE e.stream_id END, k.parts)
                   FROM {{.Schema}}.events_all e
                  WHERE e.global_sequence = $2), -1) END
  FROM (SELECT coalesce(l.partitions, nullif($3::int, 0),
                        (SELECT count(*)::int FROM {{.Schema}}.checkpoints WHERE subscriber_id = $1)) AS parts,
               l.partitions IS NOT NULL OR $3::int > 0 AS known,
               coalesce(l.partition_by, $4::text) AS by
          FROM (SELECT) one
          LEFT JOIN {{.Schema}}.subscriber_layouts l ON l.subscriber_id = $1) k;

-- name: AwaitPartitionUnrecorded
-- AwaitPartition for a role that may not read subscriber_layouts (one
-- granted by an older annals grant): the caller's count and key only.
SELECT CASE WHEN k.parts <= 1 AND k.known THEN 0
            WHEN k.parts <= 1 OR k.by = '' THEN -1 ELSE
       coalesce((SELECT {{.Schema}}.stream_partition(
                            CASE WHEN k.by = 'category' THEN split_part(e.stream_id, '-', 1)
                                 WHEN k.by LIKE 'metadata:%' THEN coalesce(e.metadata ->> substr(k.by, 10), '')
                                 ELSE e.stream_id END, k.parts)
                   FROM {{.Schema}}.events_all e
                  WHERE e.global_sequence = $2), -1) END
  FROM (SELECT coalesce(nullif($3::int, 0),
                        (SELECT count(*)::int FROM {{.Schema}}.checkpoints WHERE subscriber_id = $1)) AS parts,
               $3::int > 0 AS known,
               $4::text AS by) k;

-- name: AwaitCheckpoints
-- $1 subscriber, $2 position, $3 the partition waited for, or -1 (every
-- one): the subscriber's checkpoints, each row with the subscriber's dead
-- letter of the event at $2 (ID, status, reason, stream; NULLs when it has
-- none). The dead letter is looked up only once the checkpoints waited for
-- have all passed $2 (a one-time filter): an event dead-lettered (or
-- parked) was passed without being applied, in the same transaction as
-- the checkpoint move.
{{define "checkpoints"}}WITH c AS (SELECT partition, position FROM {{.Schema}}.checkpoints WHERE subscriber_id = $1)
SELECT c.partition, c.position, d.id, d.status, d.reason, d.stream_id
  FROM c
  LEFT JOIN (SELECT d.id, d.status, d.reason, d.stream_id
               FROM {{.Schema}}.dead_letters d
              WHERE d.subscriber_id = $1
                AND d.event_id = (SELECT e.event_id FROM {{.Schema}}.events_all e WHERE e.global_sequence = $2)
                AND (SELECT min(position) FROM c WHERE $3::int < 0 OR partition = $3::int) >= $2) d ON true{{end}}{{template "checkpoints" .}};

-- name: AwaitCheckpointsLive
-- AwaitCheckpoints of a generation's subscriber $1, each row also with the
-- subscriber and version of the live generation of the blue/green
-- projection $4 (NULLs when none is live): read by the same statement, so
-- from the same snapshot as the checkpoints, so that no cut-over or
-- rollback falls between the two (the checkpoints count only if $1 is the
-- live one). For a role that may read read_model_generations.
SELECT k.partition, k.position, k.id, k.status, k.reason, k.stream_id, g.subscriber, g.version
  FROM ({{template "checkpoints" .}}) k
  LEFT JOIN {{.Schema}}.read_model_generations g ON g.projection = $4 AND g.state = 'live';

-- name: AwaitBehind
-- $1 subscriber, $2 target, $3 partition or -1: the partition furthest
-- behind (0 at 0 when there is no checkpoint yet), how many events lie
-- after its checkpoint up to the target, and its stop reason ('' unless the
-- Stop policy halted it).
SELECT c.partition, c.position,
       (SELECT count(*) FROM {{.Schema}}.events_all e WHERE e.global_sequence > c.position AND e.global_sequence <= $2),
       c.stopped_reason
  FROM (SELECT partition, position, coalesce(stopped_reason, '') AS stopped_reason FROM {{.Schema}}.checkpoints
         WHERE subscriber_id = $1 AND ($3::int < 0 OR partition = $3::int)
        UNION ALL
        SELECT greatest($3::int, 0), 0, ''
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

-- name: AwaitPrivileges
-- Whether the role may read read_model_generations and subscriber_layouts
-- (every role of annals grant may; one granted by an older annals grant
-- may not). $1: the schema.
SELECT coalesce(has_table_privilege(to_regclass(format('%I.%I', $1::text, 'read_model_generations')), 'SELECT'), false),
       coalesce(has_table_privilege(to_regclass(format('%I.%I', $1::text, 'subscriber_layouts')), 'SELECT'), false);
