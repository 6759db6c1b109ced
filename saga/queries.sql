-- Statements of the saga package. Every one runs in the batch transaction
-- the runner opened on the saga's lock connection, except Lookup.

-- name: Load
SELECT state, version, completed
  FROM {{.Schema}}.saga_states
 WHERE saga = $1 AND correlation_id = $2;

-- name: Insert
-- A new instance. A row that appeared meanwhile is a conflict (no row
-- inserted): the caller reports it and the batch is retried.
INSERT INTO {{.Schema}}.saga_states
       (saga, correlation_id, state, version, completed, created_at, updated_at, completed_at)
VALUES ($1, $2, $3, 1, $4, $5, $5, CASE WHEN $4 THEN $5::timestamptz END)
ON CONFLICT (saga, correlation_id) DO NOTHING;

-- name: Update
-- Optimistic concurrency: only the version that was loaded is updated.
UPDATE {{.Schema}}.saga_states
   SET state = $4, version = version + 1, completed = $5, updated_at = $6,
       completed_at = CASE WHEN $5 THEN $6::timestamptz END
 WHERE saga = $1 AND correlation_id = $2 AND version = $3 AND NOT completed;

-- name: Prune
-- Completed instances older than the retention, at most $3 at a time.
DELETE FROM {{.Schema}}.saga_states
 WHERE saga = $1 AND correlation_id IN (
       SELECT correlation_id FROM {{.Schema}}.saga_states
        WHERE saga = $1 AND completed AND completed_at < $2
        ORDER BY completed_at
        LIMIT $3);

-- name: Lookup
SELECT state, version, completed, created_at, updated_at, completed_at
  FROM {{.Schema}}.saga_states
 WHERE saga = $1 AND correlation_id = $2;
