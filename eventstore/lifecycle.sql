-- Statements of the stream life cycle (lifecycle.go). {{.Schema}} is the
-- quoted schema name.

-- name: DeleteStream
SELECT event_id, global_sequence, stream_version
  FROM {{.Schema}}.delete_stream($1, $2, $3, $4);

-- name: StreamInfo
SELECT version, state, truncate_before, created_at, updated_at,
       (extract(epoch FROM max_age) * 1000000)::bigint, max_count
  FROM {{.Schema}}.streams
 WHERE stream_id = $1;

-- name: SetStreamRetention
-- $2 is the maximum age in microseconds (0: none), NULL to leave it.
-- event_id is NULL when the call changed nothing and appended no record
-- (migration 0040; global_sequence is then 0).
SELECT truncate_before, (extract(epoch FROM max_age) * 1000000)::bigint, max_count, global_sequence,
       event_id IS NOT NULL
  FROM {{.Schema}}.set_stream_retention($1, make_interval(secs => $2::bigint / 1000000.0), $3, $4);
