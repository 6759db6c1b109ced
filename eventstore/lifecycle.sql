-- Statements of the stream life cycle (lifecycle.go). {{.Schema}} is the
-- quoted schema name.

-- name: DeleteStream
SELECT event_id, global_sequence, stream_version
  FROM {{.Schema}}.delete_stream($1, $2, $3, $4);

-- name: StreamInfo
SELECT version, state, truncate_before, created_at, updated_at
  FROM {{.Schema}}.streams
 WHERE stream_id = $1;
