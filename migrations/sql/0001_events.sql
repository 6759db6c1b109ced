-- annals schema v1: the append-only event log and the streams it belongs to.
-- Rendered with the schema as {{.Schema}}; see docs/sql-api.md for the contract.

CREATE SEQUENCE {{.Schema}}.events_global_sequence AS bigint;

CREATE TABLE {{.Schema}}.events (
    global_sequence bigint      NOT NULL PRIMARY KEY,
    event_id        uuid        NOT NULL UNIQUE,
    stream_id       text        NOT NULL,
    stream_version  bigint      NOT NULL CHECK (stream_version > 0),
    event_type      text        NOT NULL CHECK (event_type <> ''),
    data            json        NOT NULL,
    metadata        json,
    recorded_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (stream_id, stream_version)
);

COMMENT ON TABLE {{.Schema}}.events IS
    'annals event log. global_sequence is commit order. Append only through append_events(); UPDATE, DELETE and TRUNCATE are refused.';

CREATE TABLE {{.Schema}}.streams (
    stream_id  text        NOT NULL PRIMARY KEY CHECK (stream_id <> ''),
    version    bigint      NOT NULL CHECK (version > 0),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

COMMENT ON TABLE {{.Schema}}.streams IS
    'annals streams: the current version of each stream, the anchor of optimistic concurrency.';

CREATE FUNCTION {{.Schema}}.events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION 'annals: the events table is append-only; % is not allowed', TG_OP
        USING ERRCODE = 'AN004',
              HINT = 'Events are facts: append a compensating event instead.';
END
$fn$;

CREATE TRIGGER events_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON {{.Schema}}.events
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Schema}}.events_append_only();

-- append_events appends p_events to stream p_stream_id.
--
-- p_expected_version: NULL = any, 0 = the stream must not exist, -1 = the stream
-- must exist, N > 0 = the stream's current version must be N.
-- p_events: a JSON array of {"type", "data", "metadata"?, "event_id"?}.
--
-- The numbering is serialized by a transaction-scoped advisory lock taken before
-- any row lock, so global_sequence order is commit order. Call it last in its
-- transaction: the lock is held until commit.
CREATE FUNCTION {{.Schema}}.append_events(p_stream_id text, p_expected_version bigint, p_events jsonb)
RETURNS TABLE (event_id uuid, global_sequence bigint, stream_version bigint)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_count    int;
    v_bad      record;
    v_with_ids int;
    v_existing int;
    v_matching int;
    v_current  bigint;
    v_first    bigint;
    v_now      timestamptz;
BEGIN
    IF p_stream_id IS NULL OR p_stream_id = '' THEN
        RAISE EXCEPTION 'annals: stream_id must not be empty' USING ERRCODE = 'AN002';
    END IF;
    IF p_expected_version < -1 THEN
        RAISE EXCEPTION 'annals: expected_version must be NULL (any), 0 (no stream), -1 (stream exists) or a version >= 1; got %',
            p_expected_version USING ERRCODE = 'AN002';
    END IF;
    IF p_events IS NULL OR jsonb_typeof(p_events) <> 'array' OR jsonb_array_length(p_events) = 0 THEN
        RAISE EXCEPTION 'annals: events must be a non-empty JSON array' USING ERRCODE = 'AN002';
    END IF;
    v_count := jsonb_array_length(p_events);

    -- Validate every element before anything is locked or written.
    SELECT x.ord, x.reason INTO v_bad
      FROM (SELECT t.ord, CASE
                WHEN jsonb_typeof(t.e) <> 'object' THEN 'is not a JSON object'
                WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(t.e) k
                             WHERE k NOT IN ('type', 'data', 'metadata', 'event_id'))
                    THEN 'has a key other than "type", "data", "metadata" and "event_id"'
                WHEN jsonb_typeof(t.e->'type') IS DISTINCT FROM 'string' OR t.e->>'type' = ''
                    THEN 'needs "type", a non-empty string'
                WHEN coalesce(jsonb_typeof(t.e->'data'), '') NOT IN ('object', 'array')
                    THEN 'needs "data", a JSON object or array'
                WHEN coalesce(jsonb_typeof(t.e->'metadata'), 'null') NOT IN ('object', 'null')
                    THEN 'has "metadata" that is not a JSON object'
                WHEN coalesce(jsonb_typeof(t.e->'event_id'), 'null') NOT IN ('string', 'null')
                     OR t.e->>'event_id' !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
                    THEN 'has "event_id" that is not a UUID'
               END AS reason
              FROM jsonb_array_elements(p_events) WITH ORDINALITY AS t(e, ord)) x
     WHERE x.reason IS NOT NULL
     ORDER BY x.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'annals: event % of % %', v_bad.ord, v_count, v_bad.reason USING ERRCODE = 'AN002';
    END IF;

    SELECT count(*) INTO v_with_ids
      FROM jsonb_array_elements(p_events) AS t(e)
     WHERE jsonb_typeof(t.e->'event_id') = 'string';
    IF v_with_ids > 1 AND v_with_ids <> (SELECT count(DISTINCT (t.e->>'event_id')::uuid)
                                           FROM jsonb_array_elements(p_events) AS t(e)
                                          WHERE jsonb_typeof(t.e->'event_id') = 'string') THEN
        RAISE EXCEPTION 'annals: the same event_id appears twice in one append' USING ERRCODE = 'AN002';
    END IF;

    -- Serialize the numbering. Taken before any row lock so that transactions
    -- appending to several streams cannot deadlock on each other.
    PERFORM pg_advisory_xact_lock({{.AppendLockK1}}, {{.AppendLockK2}});

    -- Idempotency: re-appending events that are all stored already (same IDs,
    -- stream, type and data) returns the stored positions and writes nothing.
    IF v_with_ids > 0 THEN
        SELECT count(*),
               count(*) FILTER (WHERE ev.stream_id = p_stream_id
                                  AND ev.event_type = t.e->>'type'
                                  AND ev.data::jsonb = t.e->'data')
          INTO v_existing, v_matching
          FROM jsonb_array_elements(p_events) AS t(e)
          JOIN {{.Schema}}.events ev ON ev.event_id = (t.e->>'event_id')::uuid
         WHERE jsonb_typeof(t.e->'event_id') = 'string';
        IF v_existing > 0 THEN
            IF v_existing = v_count AND v_matching = v_count THEN
                RETURN QUERY
                    SELECT ev.event_id, ev.global_sequence, ev.stream_version
                      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS t(e, ord)
                      JOIN {{.Schema}}.events ev ON ev.event_id = (t.e->>'event_id')::uuid
                     ORDER BY t.ord;
                RETURN;
            END IF;
            RAISE EXCEPTION 'annals: % of the % events in this append are already stored%', v_existing, v_count,
                CASE WHEN v_matching < v_existing
                     THEN ' with a different stream, type or data' ELSE ', the rest are not' END
                USING ERRCODE = 'AN003',
                      HINT = 'An event ID identifies one event: re-append exactly the same events to be idempotent.';
        END IF;
    END IF;

    SELECT s.version INTO v_current
      FROM {{.Schema}}.streams s
     WHERE s.stream_id = p_stream_id
       FOR UPDATE;
    IF NOT FOUND THEN
        v_current := 0;
    END IF;

    IF (p_expected_version = -1 AND v_current = 0)
       OR (p_expected_version >= 0 AND p_expected_version <> v_current) THEN
        RAISE EXCEPTION 'annals: wrong expected version for stream %: expected %, actual %',
            quote_literal(p_stream_id),
            CASE p_expected_version WHEN 0 THEN 'no stream' WHEN -1 THEN 'stream exists'
                                    ELSE p_expected_version::text END,
            v_current
            USING ERRCODE = 'AN001',
                  DETAIL = json_build_object('stream_id', p_stream_id,
                                             'expected_version', p_expected_version,
                                             'actual_version', v_current)::text;
    END IF;

    v_now := clock_timestamp();
    IF v_current = 0 THEN
        INSERT INTO {{.Schema}}.streams (stream_id, version, created_at, updated_at)
        VALUES (p_stream_id, v_count, v_now, v_now)
        ON CONFLICT (stream_id) DO NOTHING;
        IF NOT FOUND THEN
            -- Only possible when the caller's snapshot predates a concurrent
            -- append (REPEATABLE READ or SERIALIZABLE): let the caller retry.
            RAISE EXCEPTION 'annals: stream % was created concurrently', quote_literal(p_stream_id)
                USING ERRCODE = 'serialization_failure';
        END IF;
    ELSE
        UPDATE {{.Schema}}.streams
           SET version = v_current + v_count, updated_at = v_now
         WHERE stream_id = p_stream_id;
    END IF;

    -- Under the lock nobody else draws from the sequence, so the block
    -- [v_first, v_first + v_count) is ours and in stream-version order.
    v_first := nextval({{.EventsSequence}});
    IF v_count > 1 THEN
        PERFORM setval({{.EventsSequence}}, v_first + v_count - 1);
    END IF;

    RETURN QUERY
        INSERT INTO {{.Schema}}.events AS ev
               (global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at)
        SELECT v_first + t.ord - 1,
               coalesce((t.e->>'event_id')::uuid, gen_random_uuid()),
               p_stream_id,
               v_current + t.ord,
               t.e->>'type',
               (t.e->'data')::json,
               CASE WHEN jsonb_typeof(t.e->'metadata') = 'object' THEN (t.e->'metadata')::json END,
               v_now
          FROM jsonb_array_elements(p_events) WITH ORDINALITY AS t(e, ord)
        RETURNING ev.event_id, ev.global_sequence, ev.stream_version;

    PERFORM pg_notify({{.Channel}}, (v_first + v_count - 1)::text);
END
$fn$;

COMMENT ON FUNCTION {{.Schema}}.append_events(text, bigint, jsonb) IS
    'annals: append events to a stream with an expected version; returns (event_id, global_sequence, stream_version) per event. See docs/sql-api.md.';
