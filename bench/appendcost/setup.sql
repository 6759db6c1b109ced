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

-- The raw INSERT wrapped as annals wraps an append: a PL/pgSQL function,
-- SECURITY DEFINER, with append_one's three SET clauses. Between raw and
-- this row is what calling through a function costs; between this row and
-- append_one, what annals' rules cost.
CREATE FUNCTION appendcost.definer(p_stream text, p_id uuid, p_type text, p_data text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off AS $$
DECLARE
    v_pos bigint := nextval('appendcost.raw_events_global_sequence_seq');
BEGIN
    INSERT INTO appendcost.raw_events (global_sequence, event_id, stream_id, stream_version, event_type, data)
    VALUES (v_pos, p_id, p_stream, 1, p_type, p_data::json);
    RETURN v_pos;
END
$$;

-- What one append could cost if the log kept less beside its rows (a
-- prototype, not annals' contract): the expected version read from the
-- events' (stream_id, stream_version) index instead of a streams row, the
-- input rules as table constraints (evaluated in C per row), idempotency
-- by the unique event_id (ON CONFLICT DO NOTHING, the stored row compared
-- only when one is there). Returns the position, or -1 for a wrong
-- expected version, -2 for an ID stored with other content, and the
-- stored position for an idempotent re-append.
CREATE TABLE appendcost.lean_events (
    LIKE appendcost.raw_events INCLUDING ALL,
    CHECK (stream_version > 0),
    CHECK (octet_length(stream_id) BETWEEN 1 AND 512
           AND stream_id ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$'),
    CHECK (octet_length(event_type) BETWEEN 1 AND 256 AND NOT starts_with(event_type, '$stream.')
           AND event_type ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$'),
    CHECK (json_typeof(data) IN ('object', 'array')),
    CHECK (metadata IS NULL OR json_typeof(metadata) = 'object')
);
CREATE FUNCTION appendcost.lean(p_stream text, p_expected bigint, p_id uuid, p_type text, p_data text)
RETURNS bigint LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_version bigint;
    v_pos     bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('appendcost'));
    SELECT e.stream_version INTO v_version FROM appendcost.lean_events e
     WHERE e.stream_id = p_stream ORDER BY e.stream_version DESC LIMIT 1;
    v_version := coalesce(v_version, 0);
    IF p_expected IS NOT NULL AND p_expected <> v_version THEN
        RETURN -1;
    END IF;
    INSERT INTO appendcost.lean_events (global_sequence, event_id, stream_id, stream_version, event_type, data)
    VALUES (nextval('appendcost.min_positions'), p_id, p_stream, v_version + 1, p_type, p_data::json)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING global_sequence INTO v_pos;
    IF v_pos IS NULL THEN
        SELECT CASE WHEN e.stream_id = p_stream AND e.event_type = p_type AND e.data::jsonb = p_data::jsonb
                    THEN e.global_sequence ELSE -2 END
          INTO v_pos FROM appendcost.lean_events e WHERE e.event_id = p_id;
    END IF;
    RETURN v_pos;
END
$$;
