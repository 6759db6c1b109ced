-- Tables and statements of the rebuild benchmark. The read model is the same
-- for both contenders: a balance and an event count per stream.

-- name: Setup
DROP TABLE IF EXISTS {{.Schema}}.bench_rebuild_balances;
CREATE TABLE {{.Schema}}.bench_rebuild_balances (
    stream_id text   PRIMARY KEY,
    amount    bigint NOT NULL,
    events    int    NOT NULL
);
DROP TABLE IF EXISTS {{.Schema}}.bench_rebuild_checkpoint;
CREATE TABLE {{.Schema}}.bench_rebuild_checkpoint (position bigint NOT NULL);
INSERT INTO {{.Schema}}.bench_rebuild_checkpoint VALUES (0);

-- name: Upsert
-- The read-model write of one event, both contenders.
INSERT INTO {{.Schema}}.bench_rebuild_balances AS b VALUES ($1, $2, 1)
ON CONFLICT (stream_id) DO UPDATE SET amount = b.amount + EXCLUDED.amount, events = b.events + 1;

-- name: Reset
-- Clearing the read model, both contenders.
DELETE FROM {{.Schema}}.bench_rebuild_balances;

-- name: RawCheckpoint
UPDATE {{.Schema}}.bench_rebuild_checkpoint SET position = $1;

-- name: Check
-- The read model both contenders must leave: every event counted once.
SELECT coalesce(sum(events), 0) FROM {{.Schema}}.bench_rebuild_balances;

-- name: BlueGreenSetup
-- The blue/green contender's generation schemas, left by an earlier run (the
-- registry that named them went with the benchmark's schema).
DROP SCHEMA IF EXISTS rm_bench_bluegreen_g1 CASCADE;
DROP SCHEMA IF EXISTS rm_bench_bluegreen_g2 CASCADE;

-- name: BlueGreenTable
-- The blue/green contender's read model, created by its setup in the
-- generation's schema (unqualified: the search_path points there).
CREATE TABLE bench_bluegreen_balances (
    stream_id text   PRIMARY KEY,
    amount    bigint NOT NULL,
    events    int    NOT NULL
);

-- name: BlueGreenUpsert
INSERT INTO bench_bluegreen_balances AS b VALUES ($1, $2, 1)
ON CONFLICT (stream_id) DO UPDATE SET amount = b.amount + EXCLUDED.amount, events = b.events + 1;

-- name: BlueGreenCheck
-- Through the reader view the cut-over created in the benchmark's schema.
SELECT coalesce(sum(events), 0) FROM {{.Schema}}.bench_bluegreen_balances;
