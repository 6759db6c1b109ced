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

-- name: Expire
-- Rows of instances that stopped heartbeating (a process that died without
-- deregistering). $1: the expiry in microseconds; $2: this instance, never
-- expired by itself.
DELETE FROM {{.Schema}}.instances
 WHERE last_heartbeat < clock_timestamp() - $1::bigint * interval '1 microsecond'
   AND instance_id <> $2;
