-- name: Origin
-- Where the log is: the cluster (pg_control_system's system identifier,
-- which a physical standby shares with its primary, so a failover keeps it)
-- and the database.
SELECT (SELECT system_identifier::text FROM pg_catalog.pg_control_system()), pg_catalog.current_database();

-- name: Database
-- The database alone, for a role that may not run pg_control_system.
SELECT pg_catalog.current_database();

-- name: EventAt
-- The ID of the event at a position of the log, archived or not (an index
-- probe on each table): whether the stream's newest message is this log's
-- event (lastStored). No row once retention has scavenged the position.
SELECT event_id::text FROM {{.Schema}}.events_all WHERE global_sequence = $1;
