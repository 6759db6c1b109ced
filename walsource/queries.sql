-- name: Checkpoint
-- The position a subscriber partition's checkpoint holds (0: none yet).
SELECT coalesce((SELECT position FROM {{.Schema}}.checkpoints
                  WHERE subscriber_id = $1 AND partition = $2), 0);

-- name: Slots
-- The annals replication slots of the current database: whether a consumer
-- streams from each, how far it confirmed, and how much WAL it retains.
SELECT slot_name, coalesce(database, ''), active, coalesce(active_pid, 0),
       coalesce(confirmed_flush_lsn::text, ''),
       -- 0 on a standby, where pg_current_wal_lsn() is not available
       coalesce(CASE WHEN NOT pg_catalog.pg_is_in_recovery()
                     THEN pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), restart_lsn) END, 0)::bigint,
       coalesce(wal_status, '')
  FROM pg_catalog.pg_replication_slots
 WHERE slot_type = 'logical' AND slot_name LIKE 'annals\_%' AND database = current_database()
 ORDER BY slot_name;
