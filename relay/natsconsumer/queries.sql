-- name: TableReady
-- Whether the checkpoint table is there with every column CreateTable
-- makes (keep the two in step): then RunProjection runs no DDL, so a role
-- that may not create (USAGE on the schema, rights on the table) starts,
-- and a start takes no ACCESS EXCLUSIVE lock on the table that the other
-- consumers' transactions would queue behind.
SELECT pg_catalog.count(*) = 3
  FROM pg_catalog.pg_attribute a
  JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = {{.SchemaLiteral}} AND c.relname = 'relay_checkpoints'
   AND a.attname IN ('position', 'stream_created', 'event_id') AND a.attnum > 0 AND NOT a.attisdropped;

-- name: Lock
-- Serializes the creators of the checkpoint table (consumers starting at
-- once: replicas, or a service's projections): PostgreSQL's IF NOT EXISTS
-- is not safe against a concurrent creator (the loser gets a unique
-- violation on the catalogs, 23505, or 42P07). Taken in CreateTable's
-- transaction, which is READ COMMITTED whatever the session's default, so
-- that a waiter's statements after the wait see what the lock's holder
-- committed. $1, $2: lockkey.Pair(schema + ":relay-checkpoints").
SELECT pg_catalog.pg_advisory_xact_lock($1::int4, $2::int4);

-- name: CreateTable
-- Run after Lock in its transaction: under the lock to its commit, so a
-- waiter finds what the lock's holder made and makes nothing.
--
-- The checkpoints of natsconsumer projections in the service's database,
-- per durable consumer: the last JetStream stream sequence applied, in the
-- stream made at stream_created (the stream's creation time: a stream made
-- again starts its sequence again), and the position (Annals-Position) and
-- ID of the last event applied.
--
-- Tables made before position, stream_created and event_id get them (the
-- ALTER): their rows keep NULL there (unknown: the stream as it is now, no
-- position, no ID to check) until the next save.
CREATE SCHEMA IF NOT EXISTS {{.Schema}};
CREATE TABLE IF NOT EXISTS {{.Schema}}.relay_checkpoints (
    consumer       text        NOT NULL PRIMARY KEY,
    stream_seq     bigint      NOT NULL,
    position       bigint,
    stream_created timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    event_id       uuid
);
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
