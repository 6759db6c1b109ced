-- annals input limits: the checks of the Go client, in SQL, for producers
-- that call append_events directly. Limits are in bytes (UTF-8) and equal
-- the constants of package eventstore (limits.go); docs/sql-api.md lists them.
--
-- check_event_input raises SQLSTATE AN002 with a DETAIL that is a JSON object
-- {"event": n (1-based; 0 for the stream ID or expected version),
--  "field": "stream_id" | "expected_version" | "type" | "metadata" | "data+metadata",
--  "limit": bytes or null, "actual": bytes or null}.
-- It reads no table and is meant to be called by every append function after
-- the structure of p_events has been checked (each element an object with a
-- string "type", a "data" object or array and an optional "metadata" object).

CREATE FUNCTION {{.Schema}}.check_event_input(p_stream_id text, p_expected_version bigint, p_events jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
    v_count int := CASE WHEN jsonb_typeof(p_events) = 'array' THEN jsonb_array_length(p_events) ELSE 0 END;
    v_ord   int;
    v_e     jsonb;
    v_type  text;
    v_md    jsonb;
    v_field text;
    v_why   text;
    v_limit int;
    v_size  bigint;
BEGIN
    -- Fast path first: one expression for the stream and one per event, so
    -- the common case costs a few simple expression evaluations. The first
    -- regular expression matches a name with no control character (C0, DEL,
    -- C1) and at least one character that is not white space (the Unicode
    -- White_Space set, as Go's unicode.IsSpace).
    IF NOT (octet_length(p_stream_id) <= 512
            AND coalesce(p_stream_id, '') ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$'
            AND (p_expected_version IS NULL OR p_expected_version <= 9223372036854775807 - v_count)) THEN
        IF octet_length(p_stream_id) > 512 THEN
            RAISE EXCEPTION 'annals: stream_id is % bytes; the limit is 512', octet_length(p_stream_id)
                USING ERRCODE = 'AN002',
                      DETAIL = json_build_object('event', 0, 'field', 'stream_id', 'limit', 512,
                                                 'actual', octet_length(p_stream_id))::text;
        ELSIF p_stream_id ~ E'[\\x01-\\x1f\\x7f-\\x9f]' THEN
            RAISE EXCEPTION 'annals: stream_id % contains a control character', quote_literal(p_stream_id)
                USING ERRCODE = 'AN002', DETAIL = '{"event": 0, "field": "stream_id"}';
        ELSIF coalesce(p_stream_id, '') !~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$' THEN
            RAISE EXCEPTION 'annals: stream_id is empty or only whitespace'
                USING ERRCODE = 'AN002', DETAIL = '{"event": 0, "field": "stream_id"}';
        END IF;
        RAISE EXCEPTION 'annals: expected_version % leaves no room for % more events', p_expected_version, v_count
            USING ERRCODE = 'AN002', DETAIL = '{"event": 0, "field": "expected_version"}';
    END IF;

    FOR v_ord IN 1..v_count LOOP
        v_e := p_events->(v_ord - 1);
        v_type := CASE WHEN jsonb_typeof(v_e->'type') = 'string' THEN v_e->>'type' END;
        v_md := CASE WHEN jsonb_typeof(v_e->'metadata') = 'object' THEN v_e->'metadata' END;
        IF octet_length(v_type) <= 256
           AND v_type ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$'
           AND (v_md IS NULL
                OR (coalesce(jsonb_typeof(v_md->'correlation_id'), 'string') = 'string'
                    AND coalesce(jsonb_typeof(v_md->'causation_id'), 'string') = 'string'
                    AND coalesce(jsonb_typeof(v_md->'traceparent'), 'string') = 'string'
                    AND coalesce(jsonb_typeof(v_md->'tracestate'), 'string') = 'string'
                    AND CASE WHEN v_md->'schema_version' IS NULL THEN true
                             WHEN jsonb_typeof(v_md->'schema_version') = 'number'
                             THEN (v_md->>'schema_version')::numeric BETWEEN 1 AND 2147483647
                                  AND (v_md->>'schema_version')::numeric = trunc((v_md->>'schema_version')::numeric)
                             ELSE false END))
           AND coalesce(octet_length((v_e->'data')::text), 0) + coalesce(octet_length(v_md::text), 0) <= 67108864 THEN
            -- No key can be longer than 256 bytes in a smaller object.
            IF pg_column_size(v_md) > 256 THEN
                v_size := (SELECT max(octet_length(k)) FROM jsonb_object_keys(v_md) k);
                IF v_size > 256 THEN
                    RAISE EXCEPTION 'annals: event % of % metadata has a key of % bytes; the limit is 256', v_ord, v_count, v_size
                        USING ERRCODE = 'AN002',
                              DETAIL = json_build_object('event', v_ord, 'field', 'metadata', 'limit', 256, 'actual', v_size)::text;
                END IF;
            END IF;
            CONTINUE;
        END IF;

        -- Slow path: say which check failed.
        v_limit := NULL;
        v_size := NULL;
        IF octet_length(v_type) > 256 THEN
            v_field := 'type'; v_limit := 256; v_size := octet_length(v_type);
            v_why := format('is %s bytes; the limit is 256', v_size);
        ELSIF v_type ~ E'[\\x01-\\x1f\\x7f-\\x9f]' THEN
            v_field := 'type'; v_why := 'contains a control character';
        ELSIF coalesce(v_type, '') !~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$' THEN
            v_field := 'type'; v_why := 'is empty or only whitespace';
        ELSIF octet_length((v_e->'data')::text) + coalesce(octet_length(v_md::text), 0) > 67108864 THEN
            v_field := 'data+metadata'; v_limit := 67108864;
            v_size := octet_length((v_e->'data')::text) + coalesce(octet_length(v_md::text), 0);
            v_why := format('is %s bytes as stored; the limit is 67108864 (64 MiB)', v_size);
        ELSIF v_md->'schema_version' IS NOT NULL
              AND coalesce(jsonb_typeof(v_md->'correlation_id'), 'string') = 'string'
              AND coalesce(jsonb_typeof(v_md->'causation_id'), 'string') = 'string'
              AND coalesce(jsonb_typeof(v_md->'traceparent'), 'string') = 'string'
              AND coalesce(jsonb_typeof(v_md->'tracestate'), 'string') = 'string' THEN
            v_field := 'metadata'; v_why := 'has a reserved key schema_version that is not a positive integer';
        ELSE
            v_field := 'metadata';
            v_why := 'has a reserved key (correlation_id, causation_id, traceparent, tracestate) that is not a string';
        END IF;
        RAISE EXCEPTION 'annals: event % of % % %', v_ord, v_count, v_field, v_why
            USING ERRCODE = 'AN002',
                  DETAIL = json_build_object('event', v_ord, 'field', v_field, 'limit', v_limit, 'actual', v_size)::text;
    END LOOP;
END
$fn$;

COMMENT ON FUNCTION {{.Schema}}.check_event_input(text, bigint, jsonb) IS
    'annals: raises AN002 when an append breaks the input limits (stream_id and type: 1..512 and 1..256 bytes, no control characters, not only whitespace; metadata keys <= 256 bytes, reserved keys typed; data+metadata <= 64 MiB). See docs/sql-api.md.';

-- append_events as in 0001, plus the call of check_event_input before the
-- append lock is taken.
-- append_events appends p_events to stream p_stream_id.
--
-- p_expected_version: NULL = any, 0 = the stream must not exist, -1 = the stream
-- must exist, N > 0 = the stream's current version must be N.
-- p_events: a JSON array of {"type", "data", "metadata"?, "event_id"?}.
--
-- The numbering is serialized by a transaction-scoped advisory lock taken before
-- any row lock, so global_sequence order is commit order. Call it last in its
-- transaction: the lock is held until commit.
CREATE OR REPLACE FUNCTION {{.Schema}}.append_events(p_stream_id text, p_expected_version bigint, p_events jsonb)
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

    -- Input limits, checked by a function other append functions share.
    PERFORM {{.Schema}}.check_event_input(p_stream_id, p_expected_version, p_events);

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
