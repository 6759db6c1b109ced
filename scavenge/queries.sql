-- Statements of the scavenge package. {{.Schema}} is the quoted schema name.

-- name: Step
SELECT run_id, started_by, started_at, now_at, from_position, scanned_to, target_position, removed, steps, done
  FROM {{.Schema}}.scavenge($1, $2, $3);

-- name: Runs
SELECT id, started_by, coalesce(instance, ''), started_at, now_at, from_position, scanned_to, target_position,
       removed, steps, finished_at IS NOT NULL, finished_at
  FROM {{.Schema}}.scavenge_runs
 ORDER BY id DESC
 LIMIT $1;
