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

-- name: Lifecycle
-- Streams whose events the scavenger may have removed (deleted, truncated,
-- with a maximum age or count, or with a metadata stream "$$" and the ID,
-- whose records may show an earlier retention), with what the log keeps to
-- check that against:
--   state, version, truncate_before, whether max_count or max_age is set;
--   lossy: the metadata stream has retention of its own or was truncated or
--     deleted (possible before migrations 0021 and 0024): its records may
--     be gone;
--   records: how many "$stream.truncated" records it keeps, the highest
--     truncate_before they record, and whether any records a max_count or
--     max_age; then each record in version order: its position, when it
--     was recorded, its max_count (0: none) and whether it has a max_age;
--   the first and the last event of the stream (version, position);
--   the type and data->>'hard' of its event at streams.version, and the
--     type of its event at truncate_before - 1 (a deletion sets
--     truncate_before just above its "$stream.deleted" event).
SELECT s.stream_id, s.state, s.version, s.truncate_before,
       s.max_count IS NOT NULL OR s.max_age IS NOT NULL,
       coalesce(m.state <> 0 OR m.truncate_before > 1 OR m.max_count IS NOT NULL OR m.max_age IS NOT NULL, false),
       r.n, r.truncate_before, coalesce(r.limits, false),
       r.positions, r.times, r.counts, r.ages,
       f.stream_version, f.global_sequence, l.stream_version, l.global_sequence,
       v.event_type, v.hard, d.event_type
  FROM {{.Schema}}.streams s
  LEFT JOIN {{.Schema}}.streams m ON m.stream_id = '$$' || s.stream_id
  LEFT JOIN LATERAL (
       SELECT count(*) AS n,
              max(CASE WHEN e.data->>'truncate_before' ~ '^[0-9]{1,18}$' THEN (e.data->>'truncate_before')::bigint END) AS truncate_before,
              bool_or(e.data->>'max_count' IS NOT NULL OR e.data->>'max_age_seconds' IS NOT NULL) AS limits,
              coalesce(array_agg(e.global_sequence ORDER BY e.stream_version), '{}') AS positions,
              coalesce(array_agg(e.recorded_at ORDER BY e.stream_version), '{}') AS times,
              coalesce(array_agg(CASE WHEN e.data->>'max_count' ~ '^[0-9]{1,18}$' THEN (e.data->>'max_count')::bigint ELSE 0 END
                                 ORDER BY e.stream_version), '{}') AS counts,
              coalesce(array_agg(e.data->>'max_age_seconds' IS NOT NULL ORDER BY e.stream_version), '{}') AS ages
         FROM {{.Schema}}.events_all e
        WHERE e.stream_id = '$$' || s.stream_id AND e.event_type = '$stream.truncated') r ON true
  LEFT JOIN LATERAL (
       SELECT e.stream_version, e.global_sequence FROM {{.Schema}}.events_all e
        WHERE e.stream_id = s.stream_id ORDER BY e.stream_version, e.global_sequence LIMIT 1) f ON true
  LEFT JOIN LATERAL (
       SELECT e.stream_version, e.global_sequence FROM {{.Schema}}.events_all e
        WHERE e.stream_id = s.stream_id ORDER BY e.stream_version DESC, e.global_sequence DESC LIMIT 1) l ON true
  LEFT JOIN LATERAL (
       SELECT e.event_type, e.data->>'hard' AS hard FROM {{.Schema}}.events_all e
        WHERE e.stream_id = s.stream_id AND e.stream_version = s.version
        ORDER BY e.global_sequence LIMIT 1) v ON true
  LEFT JOIN LATERAL (
       SELECT e.event_type FROM {{.Schema}}.events_all e
        WHERE e.stream_id = s.stream_id AND e.stream_version = s.truncate_before - 1
        ORDER BY e.global_sequence LIMIT 1) d ON s.truncate_before > 1
 WHERE s.state <> 0 OR s.truncate_before > 1 OR s.max_count IS NOT NULL OR s.max_age IS NOT NULL
    OR m.stream_id IS NOT NULL
 ORDER BY s.stream_id;

-- name: CanReadScavengeRuns
SELECT coalesce((SELECT pg_catalog.has_table_privilege(c.oid, 'SELECT')
                   FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = {{.SchemaLiteral}} AND c.relname = 'scavenge_runs'), false);

-- name: ScavengeRuns
-- The scavenge runs that removed events (only scavenge() removes events
-- from the log): the range of positions (from_position, scanned_to] it
-- scanned, the head when it started (target_position: what its first step
-- could see), when it started and when its last step so far ended, and its
-- retention clock.
SELECT id, started_by, from_position, scanned_to, target_position, removed,
       started_at, coalesce(finished_at, updated_at), now_at
  FROM {{.Schema}}.scavenge_runs
 WHERE removed > 0
 ORDER BY id;

-- name: UnrecordedRetention
-- Streams whose max_count or max_age is not what the latest
-- "$stream.truncated" event of their metadata stream ("$$" and the ID)
-- records: set_stream_retention changes the row and appends that event in
-- one transaction. Returns the setting and the record (NULL: none). The
-- scavenger removes a stream's oldest versions first, so a record that is
-- kept is the latest one whatever the metadata stream's own retention.
-- Only when none is kept and the metadata stream has retention of its own,
-- or was truncated or deleted (possible before migrations 0021 and 0024),
-- may the record have been lost legitimately: the stream is then not
-- checked (Lifecycle notes it).
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
   AND NOT (t.data IS NULL AND EXISTS (
       SELECT 1 FROM {{.Schema}}.streams m
        WHERE m.stream_id = '$$' || s.stream_id
          AND (m.state <> 0 OR m.truncate_before > 1 OR m.max_count IS NOT NULL OR m.max_age IS NOT NULL)))
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
