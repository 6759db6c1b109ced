-- name: ReplayPaused
-- Whether the server is a standby whose WAL replay is paused
-- (pg_wal_replay_pause()); false on a server not in recovery, where
-- pg_is_wal_replay_paused() would fail.
SELECT CASE WHEN pg_is_in_recovery() THEN pg_is_wal_replay_paused() ELSE false END;
