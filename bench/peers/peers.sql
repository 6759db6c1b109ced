-- Statements of the raw contenders and of the harness. {{.Schema}} is an
-- already-quoted identifier. Each statement follows a "-- name: X" line.

-- name: DropSchema
DROP SCHEMA IF EXISTS {{.Schema}} CASCADE;

-- name: CreateSchema
CREATE SCHEMA {{.Schema}};

-- name: RawSetup
-- The raw contenders' event table: the shape of an event log (a bigserial
-- position, unique event IDs, a unique (stream, version)) and nothing more.
CREATE TABLE {{.Schema}}.events (
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

-- name: RawInsertOne
-- $1 event ID, $2 stream, $3 stream version, $4 type, $5 data.
INSERT INTO {{.Schema}}.events (event_id, stream_id, stream_version, event_type, data)
VALUES ($1, $2, $3, $4, $5);

-- name: RawInsertMany
-- $1 event IDs, $2 stream, $3 version before the first, $4 type, $5 data.
INSERT INTO {{.Schema}}.events (event_id, stream_id, stream_version, event_type, data)
SELECT t.id, $2, $3 + t.ord, $4, t.data
  FROM unnest($1::uuid[], $5::json[]) WITH ORDINALITY AS t(id, data, ord);

-- name: GlobalLock
-- Taken first in the locked contender's transaction and held through COMMIT.
SELECT pg_advisory_xact_lock($1, $2);

-- name: RawTail
-- The tailing reader of the raw contenders: $1 after (exclusive), $2 limit.
SELECT global_sequence, event_id
  FROM {{.Schema}}.events
 WHERE global_sequence > $1
 ORDER BY global_sequence
 LIMIT $2;

-- name: RawRead
-- The raw paged catch-up reader: $1 after (exclusive), $2 limit.
SELECT global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at
  FROM {{.Schema}}.events
 WHERE global_sequence > $1
 ORDER BY global_sequence
 LIMIT $2;

-- name: UnrelatedSetup
CREATE TABLE {{.Schema}}.unrelated (id bigserial PRIMARY KEY, note text NOT NULL);

-- name: UnrelatedWrite
-- The long transaction's write: it takes a transaction ID, so it holds back
-- the snapshot xmin of every other session until it ends.
INSERT INTO {{.Schema}}.unrelated (note) VALUES ('held open by the tailing check');

-- name: Settings
SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit');

-- name: Vacuum
VACUUM (ANALYZE) {{.Schema}}.{{.Table}};
