-- annals schema v6: aggregate snapshots (package aggregate).
--
-- A snapshot is a cache of an aggregate's state at a stream version: the
-- rows may be deleted at any time (TRUNCATE included) and loads replay the
-- stream instead. One row per (aggregate type, stream, schema version),
-- replaced only by a newer one: bumping an aggregate's snapshot schema
-- version leaves the old rows to the code that still reads them (a rolling
-- deploy), and they can be deleted once it is gone.

CREATE TABLE {{.Schema}}.snapshots (
    aggregate_type text        NOT NULL CHECK (aggregate_type <> ''),
    stream_id      text        NOT NULL CHECK (stream_id <> ''),
    schema_version integer     NOT NULL CHECK (schema_version > 0),
    stream_version bigint      NOT NULL CHECK (stream_version > 0),
    state          json        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (aggregate_type, stream_id, schema_version)
);

COMMENT ON TABLE {{.Schema}}.snapshots IS
    'annals: aggregate state at a stream version, a cache for loads; may be deleted at any time.';
