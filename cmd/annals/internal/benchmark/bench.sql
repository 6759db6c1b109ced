-- Tables and statements of the raw-PostgreSQL baselines.

-- name: Setup
DROP TABLE IF EXISTS {{.Schema}}.bench_raw_events;
CREATE TABLE {{.Schema}}.bench_raw_events (
    global_sequence bigserial   PRIMARY KEY,
    event_id        uuid        NOT NULL UNIQUE,
    stream_id       text        NOT NULL,
    stream_version  bigint      NOT NULL,
    event_type      text        NOT NULL,
    data            json        NOT NULL,
    metadata        json,
    recorded_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (stream_id, stream_version)
);

-- name: Teardown
DROP TABLE IF EXISTS {{.Schema}}.bench_raw_events;

-- name: RawInsert
INSERT INTO {{.Schema}}.bench_raw_events (event_id, stream_id, stream_version, event_type, data, metadata)
SELECT (t.e->>'event_id')::uuid, $1, $2 + t.ord, t.e->>'type', (t.e->'data')::json, (t.e->'metadata')::json
  FROM jsonb_array_elements($3::jsonb) WITH ORDINALITY AS t(e, ord);

-- name: Lock
SELECT pg_advisory_xact_lock($1, $2);

-- name: Settings
SELECT current_setting('fsync'), current_setting('synchronous_commit'), current_setting('server_version');

-- name: DropSchema
-- The catch-up, latency and takeover benchmarks start from an empty schema.
DROP SCHEMA IF EXISTS {{.Schema}} CASCADE;

-- name: Fill
-- $1 stream, $2 JSON array of events: one new stream per call.
SELECT count(*) FROM {{.Schema}}.append_events($1, 0, $2::jsonb);

-- name: Vacuum
-- After the fill, so that no contender pays for setting hint bits and the
-- table is in the operating system's cache for all of them.
VACUUM (ANALYZE) {{.Schema}}.events;

-- name: ReadEvents
-- The raw catch-up read: $1 after (exclusive), $2 limit.
SELECT global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at
  FROM {{.Schema}}.events
 WHERE global_sequence > $1
 ORDER BY global_sequence
 LIMIT $2;

-- name: CheckpointSetup
DROP TABLE IF EXISTS {{.Schema}}.bench_raw_checkpoint;
CREATE TABLE {{.Schema}}.bench_raw_checkpoint (position bigint NOT NULL);
INSERT INTO {{.Schema}}.bench_raw_checkpoint VALUES (0);

-- name: RawCheckpoint
UPDATE {{.Schema}}.bench_raw_checkpoint SET position = $1;

-- name: ReadRaw
-- The raw live reader of the latency benchmark: $1 after, $2 limit.
SELECT global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at
  FROM {{.Schema}}.bench_raw_events
 WHERE global_sequence > $1
 ORDER BY global_sequence
 LIMIT $2;

-- name: RawListen
LISTEN annals_bench_raw;

-- name: RawNotify
SELECT pg_notify('annals_bench_raw', $1);

-- name: Leader
-- The takeover benchmark's view of the subscriber's leadership.
SELECT epoch, coalesce(owner, '') FROM {{.Schema}}.checkpoints WHERE subscriber_id = $1 AND partition = 0;

-- name: SessionLock
SELECT pg_advisory_lock($1, $2);

-- name: SessionUnlock
SELECT pg_advisory_unlock($1, $2);

-- name: LockWaiting
-- Whether backend $1 is queued for an advisory lock.
SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = $1);
