-- annals schema: each subscriber's partition layout, recorded at its first
-- run and enforced after.
--
-- A subscriber split into partitions keeps one checkpoint per partition, and
-- the partition of an event is stream_partition(key, n): the key (the stream
-- ID, its category or a metadata field) and the count n. A subscriber run
-- with another n or key sends events to partitions whose checkpoints were
-- written for other events: events behind such a checkpoint are skipped,
-- events ahead of it repeated, and nothing said so. The catch-up engine now
-- records the layout (catchup/doc.go, "Partitions") before a subscriber's
-- first claim and refuses to run the subscriber with another one
-- (catchup.ErrPartitionLayout). A subscriber that ran before this migration
-- is judged by its checkpoints at its next run (catchup/queries.sql,
-- RecordLayout), except the generations of blue/green read models: until
-- this version their subscriptions ignored PartitionBy and were split by
-- stream ID whatever the projection said, so their layout is recorded
-- here as what it was, by stream. A projection partitioned by another key
-- then has its live generation refused instead of repartitioned in place:
-- raise its BlueGreen.Version to build a generation with the key it asks
-- for.
CREATE TABLE {{.Schema}}.subscriber_layouts (
    subscriber_id text        NOT NULL PRIMARY KEY CHECK (subscriber_id <> ''),
    partitions    integer     NOT NULL CHECK (partitions >= 1),
    partition_by  text        NOT NULL CHECK (partition_by <> ''),
    recorded_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

COMMENT ON TABLE {{.Schema}}.subscriber_layouts IS
    'annals: the partition count and key (stream, category or metadata:FIELD) each subscriber''s checkpoints were written under; the catch-up engine refuses to run a subscriber with another.';

INSERT INTO {{.Schema}}.subscriber_layouts (subscriber_id, partitions, partition_by)
SELECT g.subscriber, max(c.partition) + 1, 'stream'
  FROM {{.Schema}}.read_model_generations g
  JOIN {{.Schema}}.checkpoints c ON c.subscriber_id = g.subscriber
 GROUP BY g.subscriber;
