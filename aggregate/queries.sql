-- Statements of the aggregate package. {{.Schema}} is the quoted schema name.
-- The snapshots table is created by migration 0006_snapshots.sql; 0026 adds
-- first_version and checked_version.

-- name: LoadSnapshot
-- The snapshot, if it folds exactly the stream's visible events up to its
-- version: its first version (the first one its state folds; 1 for a row
-- older code wrote, which does not record it: checked_version is not its
-- stream_version then) is the stream's first visible one. A truncation or a
-- deletion hides the events before truncate_before, a maximum count those
-- before version - max_count + 1; a maximum age hides events by the Store's
-- clock, which this query does not know: such streams are always replayed.
-- Returns the snapshot's version, state and first version.
SELECT sn.stream_version, sn.state, f.first_version
  FROM {{.Schema}}.snapshots sn
  JOIN {{.Schema}}.streams st ON st.stream_id = sn.stream_id
 CROSS JOIN LATERAL (SELECT CASE WHEN sn.checked_version = sn.stream_version
                                 THEN sn.first_version ELSE 1 END AS first_version) f
 WHERE sn.aggregate_type = $1 AND sn.stream_id = $2 AND sn.schema_version = $3
   AND st.max_age IS NULL
   AND f.first_version = greatest(1, st.truncate_before, st.version - st.max_count + 1);

-- name: SnapshotLock
-- Taken shared by a snapshot write, before SaveSnapshot, in its transaction;
-- forget_subject (migration 0026) takes it exclusively. false: a Forget is
-- running, and the write is skipped. Through the schema's snapshot_lock
-- (migration 0034), so that a writer needs no lock function of PostgreSQL's.
SELECT {{.Schema}}.snapshot_lock();

-- name: SnapshotLockDirect
-- The same lock on a schema migrated before 0034, which has no
-- snapshot_lock: its key taken with PostgreSQL's function, as clients
-- before 0034 took it.
SELECT pg_catalog.pg_try_advisory_xact_lock_shared(pg_catalog.hashtextextended({{.SchemaLiteral}} || ':forget', 0));

-- name: SaveSnapshot
-- $1 aggregate type, $2 stream, $3 schema version, $4 stream version, $5
-- state, $6 the first version the state folds. A statement of its own after
-- SnapshotLock (READ COMMITTED: its snapshot is taken once the lock is
-- held). The row is written only
--
-- - when the stream is live and its visible events start at $6, so that the
--   state folds only visible events (a load would ignore it otherwise; and
--   its events are all still in the log for the check below), and
-- - when no event the state folds carries personal data of a subject whose
--   key is gone (forgotten; or missing, which loads refuse anyway): the
--   state may hold that data decrypted before the Forget. Events up to the
--   version of the row being replaced are not read again when that row was
--   written by this statement with the same first version: no subject of
--   its events can have been forgotten since, or forget_subject would have
--   deleted it.
--
-- It never replaces a snapshot with an older one: two writers of one stream
-- may finish their snapshot writes in either order.
INSERT INTO {{.Schema}}.snapshots AS s (aggregate_type, stream_id, schema_version, stream_version, state,
                                        first_version, checked_version)
SELECT $1::text, $2::text, $3::int, $4::bigint, $5::json, $6::bigint, $4::bigint
  FROM {{.Schema}}.streams st
 WHERE st.stream_id = $2::text AND st.state = 0 AND st.max_age IS NULL AND $4::bigint <= st.version
   AND $6::bigint = greatest(1, st.truncate_before, st.version - st.max_count + 1)
   AND NOT EXISTS (
       SELECT 1
         FROM {{.Schema}}.events_all e
        CROSS JOIN LATERAL jsonb_path_query(e.data::jsonb, '$.*."$personal".subject') AS p(subject)
         LEFT JOIN {{.Schema}}.personal_keys k ON k.subject = p.subject #>> '{}'
        WHERE e.stream_id = $2::text
          AND e.stream_version <= $4::bigint
          AND e.stream_version >= coalesce(
                (SELECT o.stream_version + 1
                   FROM {{.Schema}}.snapshots o
                  WHERE o.aggregate_type = $1::text AND o.stream_id = $2::text AND o.schema_version = $3::int
                    AND o.first_version = $6::bigint AND o.checked_version = o.stream_version
                    AND o.stream_version < $4::bigint),
                $6::bigint)
          AND strpos(e.data::text, '"$personal"') > 0
          AND k.wrapped_key IS NULL)
ON CONFLICT (aggregate_type, stream_id, schema_version) DO UPDATE
   SET stream_version  = EXCLUDED.stream_version,
       state           = EXCLUDED.state,
       created_at      = EXCLUDED.created_at,
       first_version   = EXCLUDED.first_version,
       checked_version = EXCLUDED.checked_version
 WHERE s.stream_version < EXCLUDED.stream_version;
