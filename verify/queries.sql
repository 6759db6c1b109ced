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
-- deleted, truncated, or with a maximum age or count; and whether for a
-- reason other than the maximum count or age.
SELECT stream_id, state <> 0 OR truncate_before > 1
  FROM {{.Schema}}.streams
 WHERE state <> 0 OR truncate_before > 1 OR max_count IS NOT NULL OR max_age IS NOT NULL;

-- name: UnrecordedRetention
-- Streams whose max_count or max_age is not what the latest
-- "$stream.truncated" event of their metadata stream ("$$" and the ID)
-- records: set_stream_retention changes the row and appends that event in
-- one transaction. Returns the setting and the record (NULL: none). A
-- metadata stream that has retention of its own, or was truncated or
-- deleted (possible before migration 0021), may have lost the record
-- legitimately: its stream is not checked.
SELECT s.stream_id,
       format('max_count %s, max_age %s', coalesce(s.max_count::text, 'none'), coalesce(s.max_age::text, 'none')),
       t.data::text
  FROM {{.Schema}}.streams s
  LEFT JOIN LATERAL (
       SELECT e.data
         FROM {{.Schema}}.events_all e
        WHERE e.stream_id = '$$' || s.stream_id AND e.event_type = '$stream.truncated'
        ORDER BY e.stream_version DESC
        LIMIT 1) t ON true
 WHERE (s.max_count IS NOT NULL OR s.max_age IS NOT NULL)
   AND (t.data IS NULL
        OR (t.data->>'max_count')::bigint IS DISTINCT FROM s.max_count
        OR (t.data->>'max_age_seconds')::float8 IS DISTINCT FROM extract(epoch FROM s.max_age)::float8)
   AND NOT EXISTS (
       SELECT 1 FROM {{.Schema}}.streams m
        WHERE m.stream_id = '$$' || s.stream_id
          AND (m.state <> 0 OR m.truncate_before > 1 OR m.max_count IS NOT NULL OR m.max_age IS NOT NULL))
 ORDER BY s.stream_id;

-- name: SamePosition
-- Positions held by a row of events and one of events_archive.
SELECT e.global_sequence, e.stream_id, a.stream_id
  FROM {{.Schema}}.events e
  JOIN {{.Schema}}.events_archive a ON a.global_sequence = e.global_sequence
 ORDER BY e.global_sequence;

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
