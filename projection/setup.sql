-- Read-model setup records (projection.EnsureSetup).

-- name: SetupLock
-- Serializes the setup of one projection across every process, until the
-- transaction ends. $1, $2: advisorylock.Key(schema + ":setup:" + name).
-- Only in a READ COMMITTED transaction (READ UNCOMMITTED is the same in
-- PostgreSQL), whose next statement sees what the lock's holder committed;
-- a REPEATABLE READ or SERIALIZABLE one keeps the snapshot it took before
-- the wait, so it gets no lock (false) and EnsureSetup refuses it. Returns
-- the transaction's isolation and whether it took the lock.
SELECT s.isolation,
       CASE WHEN s.isolation IN ('read committed', 'read uncommitted')
            THEN (SELECT true FROM pg_catalog.pg_advisory_xact_lock($1::int4, $2::int4))
            ELSE false END
  FROM (SELECT pg_catalog.current_setting('transaction_isolation') AS isolation) s;

-- name: SetupVersion
SELECT version FROM {{.Schema}}.read_model_setups WHERE projection = $1;

-- name: RecordSetup
INSERT INTO {{.Schema}}.read_model_setups (projection, version, applied_by)
VALUES ($1, $2, $3)
ON CONFLICT (projection) DO UPDATE
   SET version = EXCLUDED.version, applied_by = EXCLUDED.applied_by, applied_at = clock_timestamp();
