-- name: CreateSchema
CREATE SCHEMA IF NOT EXISTS {{.Schema}};

-- name: CreateTable
-- The checkpoints of natsconsumer projections in the service's database,
-- per durable consumer: the last JetStream stream sequence applied, in the
-- stream made at stream_created (the stream's creation time: a stream made
-- again starts its sequence again), and the position (Annals-Position) and
-- ID of the last event applied.
CREATE TABLE IF NOT EXISTS {{.Schema}}.relay_checkpoints (
    consumer       text        NOT NULL PRIMARY KEY,
    stream_seq     bigint      NOT NULL,
    position       bigint,
    stream_created timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    event_id       uuid
);

-- name: UpgradeTable
-- Tables made before position, stream_created and event_id: their rows
-- keep NULL there (unknown: the stream as it is now, no position, no ID to
-- check) until the next save.
ALTER TABLE {{.Schema}}.relay_checkpoints
    ADD COLUMN IF NOT EXISTS position bigint,
    ADD COLUMN IF NOT EXISTS stream_created timestamptz,
    ADD COLUMN IF NOT EXISTS event_id uuid;

-- name: Load
SELECT stream_seq, position, stream_created, event_id FROM {{.Schema}}.relay_checkpoints WHERE consumer = $1;

-- name: Save
-- Forward only within one stream; a stream made again restarts the sequence.
-- No row changed: the checkpoint is at or past this message of this stream
-- already (applied and committed before: a commit whose answer was lost);
-- RunProjection reads it (Load) in the same transaction to tell, and rolls
-- back.
INSERT INTO {{.Schema}}.relay_checkpoints AS c (consumer, stream_seq, position, stream_created, event_id) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (consumer) DO UPDATE SET stream_seq = excluded.stream_seq, position = excluded.position,
       stream_created = excluded.stream_created, event_id = excluded.event_id, updated_at = clock_timestamp()
 WHERE c.stream_seq < excluded.stream_seq OR c.stream_created IS DISTINCT FROM excluded.stream_created;
