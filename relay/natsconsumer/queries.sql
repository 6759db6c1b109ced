-- name: CreateSchema
CREATE SCHEMA IF NOT EXISTS {{.Schema}};

-- name: CreateTable
-- The checkpoints of natsconsumer projections in the service's database:
-- the last JetStream stream sequence applied, per durable consumer.
CREATE TABLE IF NOT EXISTS {{.Schema}}.relay_checkpoints (
    consumer   text        NOT NULL PRIMARY KEY,
    stream_seq bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: Load
SELECT coalesce((SELECT stream_seq FROM {{.Schema}}.relay_checkpoints WHERE consumer = $1), 0);

-- name: Save
INSERT INTO {{.Schema}}.relay_checkpoints AS c (consumer, stream_seq) VALUES ($1, $2)
ON CONFLICT (consumer) DO UPDATE SET stream_seq = excluded.stream_seq, updated_at = clock_timestamp()
 WHERE c.stream_seq < excluded.stream_seq;
