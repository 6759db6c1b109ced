-- The instance registry of the runner.

-- name: Register
INSERT INTO {{.Schema}}.instances (instance_id, host, pid, started_at, last_heartbeat, leads)
VALUES ($1, $2, $3, clock_timestamp(), clock_timestamp(), $4)
ON CONFLICT (instance_id) DO UPDATE
   SET host = EXCLUDED.host, pid = EXCLUDED.pid, started_at = EXCLUDED.started_at,
       last_heartbeat = EXCLUDED.last_heartbeat, leads = EXCLUDED.leads;

-- name: Heartbeat
UPDATE {{.Schema}}.instances
   SET last_heartbeat = clock_timestamp(), leads = $2
 WHERE instance_id = $1;

-- name: Deregister
DELETE FROM {{.Schema}}.instances WHERE instance_id = $1;
