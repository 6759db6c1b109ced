-- Read-model setup records (projection.EnsureSetup).

-- name: SetupLock
-- Serializes the setup of one projection across every process, until the
-- transaction ends. $1, $2: advisorylock.Key(schema + ":setup:" + name).
SELECT pg_catalog.pg_advisory_xact_lock($1::int4, $2::int4);

-- name: SetupVersion
SELECT version FROM {{.Schema}}.read_model_setups WHERE projection = $1;

-- name: RecordSetup
INSERT INTO {{.Schema}}.read_model_setups (projection, version, applied_by)
VALUES ($1, $2, $3)
ON CONFLICT (projection) DO UPDATE
   SET version = EXCLUDED.version, applied_by = EXCLUDED.applied_by, applied_at = clock_timestamp();
