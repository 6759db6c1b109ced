-- Statements of the verify package. All run in one REPEATABLE READ READ ONLY
-- transaction, so they see one snapshot of the log.

-- name: Head
SELECT greatest((SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events),
                (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events_archive));

-- name: CanReadSequence
SELECT coalesce((SELECT pg_catalog.has_sequence_privilege(c.oid, 'SELECT')
                   FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = {{.SchemaLiteral}} AND c.relname = 'events_global_sequence'), false);

-- name: Sequence
-- The last position append_events drew (0 if none). Sequences are not
-- transactional: this is the value now, never lower than at the snapshot.
SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {{.Schema}}.events_global_sequence;

-- name: Retained
-- Streams whose oldest or newest events the scavenger may have removed:
-- deleted, truncated, or with a maximum age or count.
SELECT stream_id
  FROM {{.Schema}}.streams
 WHERE state <> 0 OR truncate_before > 1 OR max_count IS NOT NULL OR max_age IS NOT NULL;

-- name: Events
-- $1 after (exclusive), $2 limit. data and metadata as stored (json keeps
-- the bytes as written).
SELECT global_sequence, event_id, stream_id, stream_version, event_type,
       data::text, metadata::text, recorded_at
  FROM {{.Schema}}.events_all
 WHERE global_sequence > $1
 ORDER BY global_sequence
 LIMIT $2;

-- name: Streams
-- $1 after (exclusive; '' first), $2 limit.
SELECT stream_id, version
  FROM {{.Schema}}.streams
 WHERE stream_id > $1
 ORDER BY stream_id
 LIMIT $2;
