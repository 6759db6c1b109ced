-- The sequencer prototype that docs/architecture.md compares with group
-- commit: writers insert unpositioned rows with no global lock (the
-- per-stream unique index is the optimistic check), and one sequencer
-- numbers committed rows in id order, one transaction at a time.
DROP SCHEMA IF EXISTS seqproto CASCADE;
CREATE SCHEMA seqproto;
CREATE SEQUENCE seqproto.positions;
CREATE TABLE seqproto.events (
    id              bigserial   PRIMARY KEY,
    global_sequence bigint      UNIQUE,
    event_id        uuid        NOT NULL UNIQUE,
    stream_id       text        NOT NULL,
    stream_version  bigint      NOT NULL,
    event_type      text        NOT NULL,
    data            json        NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (stream_id, stream_version)
);
-- The sequencer's work list: unpositioned rows, in id order.
CREATE INDEX ON seqproto.events (id) WHERE global_sequence IS NULL;
CREATE TABLE seqproto.raw (
    global_sequence bigserial   PRIMARY KEY,
    event_id        uuid        NOT NULL UNIQUE,
    stream_id       text        NOT NULL,
    stream_version  bigint      NOT NULL,
    event_type      text        NOT NULL,
    data            json        NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (stream_id, stream_version)
);
