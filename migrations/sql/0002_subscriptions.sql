-- annals schema v2: what the subscription runner keeps: checkpoints with
-- fencing epochs, the instance registry, and the partition function.

CREATE TABLE {{.Schema}}.checkpoints (
    subscriber_id text        NOT NULL CHECK (subscriber_id <> ''),
    partition     integer     NOT NULL DEFAULT 0 CHECK (partition >= 0),
    position      bigint      NOT NULL DEFAULT 0 CHECK (position >= 0),
    epoch         bigint      NOT NULL DEFAULT 0,
    owner         text,
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (subscriber_id, partition)
);

COMMENT ON TABLE {{.Schema}}.checkpoints IS
    'annals: the last position each subscriber (partition) has processed. epoch is bumped by every new leader; a write with an older epoch is refused (fencing).';

CREATE TABLE {{.Schema}}.instances (
    instance_id    text        NOT NULL PRIMARY KEY,
    host           text        NOT NULL,
    pid            integer     NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_heartbeat timestamptz NOT NULL DEFAULT clock_timestamp(),
    leads          jsonb       NOT NULL DEFAULT '[]'
);

COMMENT ON TABLE {{.Schema}}.instances IS
    'annals: runner processes, their heartbeats and the subscriber partitions each leads (leads: [{subscriber, partition, epoch}]).';

-- stream_partition maps a stream to one of p_partitions partitions by the
-- first four bytes of md5(stream_id): stable across PostgreSQL versions and
-- computable in any language.
CREATE FUNCTION {{.Schema}}.stream_partition(p_stream_id text, p_partitions integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN ((('x' || substr(md5(p_stream_id), 1, 8))::bit(32)::int4)::bigint & 2147483647) % p_partitions;
