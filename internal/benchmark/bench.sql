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
