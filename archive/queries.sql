-- Statements of the archive package. {{.Schema}} is the quoted schema name.

-- name: Step
SELECT run_id, started_by, started_at, requested_before, from_position, archived_to, target_position, moved, steps, done
  FROM {{.Schema}}.archive($1, $2, $3);

-- name: Runs
SELECT id, started_by, coalesce(instance, ''), started_at, requested_before, from_position, archived_to, target_position,
       moved, steps, finished_at IS NOT NULL, finished_at
  FROM {{.Schema}}.archive_runs
 ORDER BY id DESC
 LIMIT $1;

-- name: Status
-- The archive horizon (every position below it is archived or scavenged,
-- every one at or above it is in events), the events moved by all runs,
-- the newest archived position, the head, and each table's size with its
-- indexes and TOAST, and its row estimate (-1: not analyzed yet).
SELECT coalesce((SELECT max(archived_to) FROM {{.Schema}}.archive_runs), 0) + 1,
       coalesce((SELECT sum(moved) FROM {{.Schema}}.archive_runs), 0)::bigint,
       (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events_archive),
       greatest((SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events),
                (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events_archive)),
       pg_catalog.pg_total_relation_size(pg_catalog.format('%I.events', {{.SchemaLiteral}})::regclass),
       pg_catalog.pg_total_relation_size(pg_catalog.format('%I.events_archive', {{.SchemaLiteral}})::regclass),
       (SELECT reltuples::bigint FROM pg_catalog.pg_class WHERE oid = pg_catalog.format('%I.events', {{.SchemaLiteral}})::regclass),
       (SELECT reltuples::bigint FROM pg_catalog.pg_class WHERE oid = pg_catalog.format('%I.events_archive', {{.SchemaLiteral}})::regclass);
