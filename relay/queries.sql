-- name: Origin
-- Where the log is: the cluster (pg_control_system's system identifier,
-- which a physical standby shares with its primary, so a failover keeps it)
-- and the database.
SELECT (SELECT system_identifier::text FROM pg_catalog.pg_control_system()), pg_catalog.current_database();

-- name: Database
-- The database alone, for a role that may not run pg_control_system.
SELECT pg_catalog.current_database();
