-- Statements of the aggregate package. {{.Schema}} is the quoted schema name.
-- The snapshots table is created by migration 0006_snapshots.sql.

-- name: LoadSnapshot
SELECT stream_version, state
  FROM {{.Schema}}.snapshots
 WHERE aggregate_type = $1 AND stream_id = $2 AND schema_version = $3;

-- name: SaveSnapshot
-- Never replaces a snapshot with an older one: two writers of one stream may
-- finish their snapshot writes in either order.
INSERT INTO {{.Schema}}.snapshots AS s (aggregate_type, stream_id, schema_version, stream_version, state)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (aggregate_type, stream_id, schema_version) DO UPDATE
   SET stream_version = EXCLUDED.stream_version,
       state          = EXCLUDED.state,
       created_at     = EXCLUDED.created_at
 WHERE s.stream_version < EXCLUDED.stream_version;
