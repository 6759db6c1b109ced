-- Baselines for run.sh (docs/benchmarks.md, "CPU per event"): a raw table
-- shaped like annals.events, and the least an ordered append can do through
-- a function (the ordering lock, a position, one INSERT). Needs the annals
-- schema migrated in the same database (annals dev does that).
DROP SCHEMA IF EXISTS appendcost CASCADE;
CREATE SCHEMA appendcost;
CREATE TABLE appendcost.raw_events (
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
CREATE TABLE appendcost.min_events (LIKE appendcost.raw_events INCLUDING ALL);
CREATE SEQUENCE appendcost.min_positions;
CREATE FUNCTION appendcost.minimal(p_stream text, p_id uuid, p_data text) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('appendcost'));
    INSERT INTO appendcost.min_events (global_sequence, event_id, stream_id, stream_version, event_type, data)
    VALUES (nextval('appendcost.min_positions'), p_id, p_stream, 1, 'bench.deposited', p_data::json);
END
$$;
