-- annals schema: append_one, the append of one event, and the input rules
-- in one place.
--
-- A lone append of one event is what a service handling one request at a
-- time makes, and through append_batch it paid for the machinery of a group:
-- eight arrays unpacked by three queries over unnest, per-append arrays of
-- versions and states, RETURN QUERY through a tuplestore. append_one takes
-- the event as scalars and runs the same rules with the least work:
--
-- - the input rules are two boolean expressions (stream_input_bad,
--   event_input_bad below), evaluated as PL/pgSQL simple expressions, which
--   start no executor;
-- - the stream's version is advanced by one UPDATE of its row, which also
--   checks the expected version and the state (live); only when it updates
--   nothing (a new stream, a wrong expected version, a deleted stream) is
--   the row read and, for a new or recreated stream, inserted;
-- - the event is one INSERT ... VALUES, its outcome four OUT parameters.
--
-- Same rules, outcomes and error codes as append_batch called with one
-- append of one event (status 0 written, 1 wrong expected version, 2 event
-- ID conflict, 3 stored already, 4 deleted, 5 hard-deleted; AN002 for bad
-- input, raised by append_batch_refuse with the same DETAIL). The Go client
-- sends a group of one single-event append through it.
--
-- stream_input_bad and event_input_bad are SQL functions whose body is one
-- expression: the planner inlines them into the statement that calls them
-- (migrations/TestInputRulesInlined checks it), so append_batch's per-event
-- aggregate, redefined here to call them, costs what it did, and the rules
-- exist once.

-- stream_input_bad reports whether an append's stream ID or expected
-- version breaks the input rules of check_event_input for an append of
-- p_events events: a stream ID of 1..512 bytes with no control character and
-- not only white space; an expected version NULL (any), -1 (the stream
-- exists), 0 (no stream) or a version that leaves room for the events.
CREATE FUNCTION {{.Schema}}.stream_input_bad(p_stream text, p_expected bigint, p_events int)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_stream IS NULL
    OR coalesce(p_expected < -1 OR p_expected > 9223372036854775807 - p_events, false)
    OR NOT (octet_length(p_stream) <= 512
            AND p_stream ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$');

-- event_input_bad reports whether an event's type, data or metadata breaks
-- the input rules of check_event_input: a type of 1..256 bytes with no
-- control character, not only white space and not reserved ($stream.); data
-- a JSON object or array by its first character, metadata NULL, '' or a JSON
-- object by its first character that keeps metadata_ok; at most 64 MiB of
-- data and metadata; nothing jsonb cannot hold. (The json casts of the
-- INSERT check the rest of the syntax.)
CREATE FUNCTION {{.Schema}}.event_input_bad(p_type text, p_data text, p_metadata text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_type IS NULL OR p_data IS NULL
    OR starts_with(p_type, '$stream.')
    OR NOT (octet_length(p_type) <= 256
            AND p_type ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$')
    OR left(ltrim(p_data, E' \t\r\n'), 1) NOT IN ('{', '[')
    OR octet_length(p_data) + coalesce(octet_length(p_metadata), 0) > 67108864
    OR (strpos(p_data, E'\\u') > 0 AND NOT {{.Schema}}.jsonb_storable(p_data))
    OR (p_metadata IS NOT NULL AND p_metadata <> ''
        AND (left(ltrim(p_metadata, E' \t\r\n'), 1) <> '{'
             OR (strpos(p_metadata, E'\\u') > 0 AND NOT {{.Schema}}.jsonb_storable(p_metadata))
             OR NOT {{.Schema}}.metadata_ok(p_metadata::jsonb)));

-- append_batch as in 0017, its per-event input check written with the two
-- functions above (inlined: the same expression as before), and the calls
-- made for their effect (lock, setval, NOTIFY) assigned instead of PERFORMed
-- (see append_one's v_void).
CREATE OR REPLACE FUNCTION {{.Schema}}.append_batch(
    p_streams text[], p_expected bigint[], p_append int[], p_index int[], p_ids uuid[],
    p_types text[], p_data text[], p_metadata text[], p_check_ids boolean)
RETURNS TABLE (stream_id text, status smallint, event_id uuid, global_sequence bigint,
               stream_version bigint, actual_version bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
#variable_conflict use_column
DECLARE
    v_appends  int := coalesce(cardinality(p_streams), 0);
    v_events   int := coalesce(cardinality(p_ids), 0);
    v_bad      boolean;
    v_count    int[];
    v_current  bigint[];
    v_state    smallint[];
    v_status   smallint[];
    v_existing int[];
    v_matching int[];
    v_existing1 int;
    v_matching1 int;
    v_failed   boolean := false;
    v_first    bigint;
    v_now      timestamptz;
    v_data     json[];
    i          int;
    v_step0    bigint;
    v_step     bigint;
    v_locked   boolean := false;
    v_void     text; -- see append_one
BEGIN
    -- Every array: one-dimensional, 1-based, of the right length. (An array
    -- such as '[0:1]={a,b}' would otherwise make the subscripts below point
    -- at the wrong elements, or at none.)
    IF v_appends = 0 OR v_events = 0
       OR array_ndims(p_streams) <> 1 OR array_lower(p_streams, 1) <> 1
       OR coalesce(array_ndims(p_expected), 0) <> 1 OR array_lower(p_expected, 1) <> 1
       OR cardinality(p_expected) <> v_appends
       OR array_ndims(p_ids) <> 1 OR array_lower(p_ids, 1) <> 1
       OR coalesce(array_ndims(p_append), 0) <> 1 OR array_lower(p_append, 1) <> 1 OR cardinality(p_append) <> v_events
       OR coalesce(array_ndims(p_index), 0) <> 1 OR array_lower(p_index, 1) <> 1 OR cardinality(p_index) <> v_events
       OR coalesce(array_ndims(p_types), 0) <> 1 OR array_lower(p_types, 1) <> 1 OR cardinality(p_types) <> v_events
       OR coalesce(array_ndims(p_data), 0) <> 1 OR array_lower(p_data, 1) <> 1 OR cardinality(p_data) <> v_events
       OR coalesce(array_ndims(p_metadata), 0) <> 1 OR array_lower(p_metadata, 1) <> 1 OR cardinality(p_metadata) <> v_events
       OR p_check_ids IS NULL THEN
        RAISE EXCEPTION 'annals: append_batch needs at least one append and one event, in one-dimensional arrays that start at 1 and have matching lengths'
            USING ERRCODE = 'AN002', DETAIL = '{"event": 0, "field": "arrays"}';
    END IF;
    -- Everything else the arguments must satisfy but distinctness (the
    -- step after this one), in one statement: each event's input rules
    -- (event_input_bad) and, at each append's first event (the order rule
    -- gives every append exactly one event numbered 1), the append's stream
    -- and expected version (stream_input_bad); events listed append by
    -- append (1, 2, ... n) and numbered 1, 2, ... within each. It also
    -- counts each append's events. Which rule was broken is worked out only
    -- when one was (append_batch_refuse).
    SELECT bool_or(e.a IS NULL OR e.i IS NULL OR e.id IS NULL
                   OR CASE WHEN e.ord = 1 THEN e.a <> 1 OR e.i <> 1
                           WHEN e.a = p_append[e.ord - 1] THEN e.i <> p_index[e.ord - 1] + 1
                           ELSE e.a <> p_append[e.ord - 1] + 1 OR e.i <> 1 END
                   OR {{.Schema}}.event_input_bad(e.t, e.d, e.m)
                   OR (e.i = 1 AND {{.Schema}}.stream_input_bad(p_streams[e.a], p_expected[e.a], v_events)))
           OR max(e.a) <> v_appends,
           array_agg(e.i ORDER BY e.ord) FILTER (WHERE e.ord = v_events OR p_append[e.ord + 1] <> e.a)
      INTO v_bad, v_count
      FROM unnest(p_append, p_index, p_ids, p_types, p_data, p_metadata) WITH ORDINALITY AS e(a, i, id, t, d, m, ord);
    -- Event IDs and streams distinct: sorted and counted when a call has
    -- more than 16 events, compared pairwise when it has fewer (a call of
    -- one event has nothing to compare; a call of one append, no streams).
    IF v_bad IS FALSE AND v_events > 16 THEN
        SELECT (SELECT count(DISTINCT x.id) FROM unnest(p_ids) AS x(id)) <> v_events
               OR (SELECT count(DISTINCT a.s) FROM unnest(p_streams) AS a(s)) <> v_appends
          INTO v_bad;
    ELSIF v_bad IS FALSE THEN
        -- A few: compared pairwise, in expressions that start no query.
        FOR i IN 2 .. v_events LOOP
            v_bad := v_bad OR p_ids[i] = ANY (p_ids[1:i - 1]);
        END LOOP;
        FOR i IN 2 .. v_appends LOOP
            v_bad := v_bad OR p_streams[i] = ANY (p_streams[1:i - 1]);
        END LOOP;
    END IF;
    IF v_bad IS NOT FALSE OR cardinality(v_count) IS DISTINCT FROM v_appends THEN
        PERFORM {{.Schema}}.append_batch_refuse(p_streams, p_expected, p_append, p_index, p_ids, p_types, p_data, p_metadata);
    END IF;

    v_status := array_fill(0::smallint, ARRAY[v_appends]);
    -- Parse the payloads before the lock too (the INSERT stores them as is).
    v_data := p_data::json[];

    -- Idempotency, before the lock (see 0017 and 0015's header).
    IF p_check_ids THEN
        v_step0 := pg_sequence_last_value({{.ArchiveStepSequence}});
    END IF;
    LOOP
        IF p_check_ids AND v_events = 1 THEN
            SELECT count(*)::int, count(*) FILTER (WHERE x.stream_id = p_streams[1] AND x.event_type = p_types[1]
                                                     AND x.data::jsonb = p_data[1]::jsonb)::int
              INTO v_existing1, v_matching1
              FROM {{.Schema}}.events_all x WHERE x.event_id = p_ids[1];
            IF v_existing1 > 0 THEN
                v_status[1] := CASE WHEN v_existing1 = 1 AND v_matching1 = 1 THEN 3 ELSE 2 END;
                v_failed := true;
            END IF;
        ELSIF p_check_ids
              AND (EXISTS (SELECT 1 FROM {{.Schema}}.events x WHERE x.event_id = ANY (p_ids))
                   OR EXISTS (SELECT 1 FROM {{.Schema}}.events_archive x WHERE x.event_id = ANY (p_ids))) THEN
            SELECT array_agg(coalesce(x.existing, 0) ORDER BY g.n), array_agg(coalesce(x.matching, 0) ORDER BY g.n)
              INTO v_existing, v_matching
              FROM generate_series(1, v_appends) AS g(n)
              LEFT JOIN (SELECT e.a, count(*)::int AS existing,
                                count(*) FILTER (WHERE ev.stream_id = p_streams[e.a] AND ev.event_type = e.t
                                                   AND ev.data::jsonb = e.d::jsonb)::int AS matching
                           FROM unnest(p_append, p_ids, p_types, p_data) AS e(a, id, t, d)
                           CROSS JOIN LATERAL (SELECT x.stream_id, x.event_type, x.data
                                                 FROM {{.Schema}}.events_all x WHERE x.event_id = e.id) ev
                          GROUP BY e.a) x ON x.a = g.n;
            FOR i IN 1 .. v_appends LOOP
                IF v_existing[i] > 0 THEN
                    v_status[i] := CASE WHEN v_existing[i] = v_count[i] AND v_matching[i] = v_count[i] THEN 3 ELSE 2 END;
                    v_failed := true;
                END IF;
            END LOOP;
        END IF;
        EXIT WHEN v_locked;
        v_void := pg_advisory_xact_lock({{.AppendLockK1}}, {{.AppendLockK2}});
        v_locked := true;
        EXIT WHEN NOT p_check_ids;
        v_step := pg_sequence_last_value({{.ArchiveStepSequence}});
        IF v_step IS NOT NULL AND NOT pg_visible_in_snapshot(v_step::text::xid8, pg_current_snapshot()) THEN
            RAISE EXCEPTION 'annals: events were archived after this transaction''s snapshot was taken; retry the append'
                USING ERRCODE = 'serialization_failure';
        END IF;
        EXIT WHEN v_step IS NOT DISTINCT FROM v_step0;
        v_status := array_fill(0::smallint, ARRAY[v_appends]);
        v_failed := false;
    END LOOP;

    SELECT array_agg(coalesce(s.version, 0) ORDER BY a.n), array_agg(coalesce(s.state, 0::smallint) ORDER BY a.n)
      INTO v_current, v_state
      FROM unnest(p_streams) WITH ORDINALITY AS a(id, n)
      LEFT JOIN {{.Schema}}.streams s ON s.stream_id = a.id;

    FOR i IN 1 .. v_appends LOOP
        IF v_status[i] = 0
           AND (v_state[i] <> 0
                OR (p_expected[i] = -1 AND v_current[i] = 0)
                OR (p_expected[i] >= 0 AND p_expected[i] <> v_current[i])) THEN
            v_status[i] := CASE WHEN v_state[i] = 2 THEN 5
                                WHEN v_state[i] = 1 AND p_expected[i] IS DISTINCT FROM v_current[i] THEN 4
                                WHEN v_state[i] = 1 THEN 0 -- expects exactly its version: recreates it
                                ELSE 1 END;
            v_failed := v_failed OR v_status[i] <> 0;
        END IF;
    END LOOP;

    IF v_failed THEN
        RETURN QUERY
            SELECT p_streams[g.n], v_status[g.n], NULL::uuid, NULL::bigint, NULL::bigint, v_current[g.n]
              FROM generate_series(1, v_appends) AS g(n)
             WHERE v_status[g.n] IN (1, 2, 4, 5);
        RETURN QUERY
            SELECT p_streams[e.a], 3::smallint, ev.event_id, ev.global_sequence, ev.stream_version, NULL::bigint
              FROM unnest(p_append, p_ids) AS e(a, id)
              CROSS JOIN LATERAL (SELECT x.event_id, x.global_sequence, x.stream_version
                                    FROM {{.Schema}}.events_all x WHERE x.event_id = e.id) ev
             WHERE v_status[e.a] = 3;
        IF NOT (0 = ANY (v_status)) THEN
            RETURN;
        END IF;
    END IF;

    v_now := clock_timestamp();
    INSERT INTO {{.Schema}}.streams AS s (stream_id, version, created_at, updated_at)
    SELECT a.id, v_current[a.n] + v_count[a.n], v_now, v_now
      FROM unnest(p_streams) WITH ORDINALITY AS a(id, n)
     WHERE v_status[a.n] = 0
    ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at, state = 0;

    v_first := nextval({{.EventsSequence}});
    IF v_events > 1 THEN
        v_void := setval({{.EventsSequence}}, v_first + v_events - 1);
    END IF;

    RETURN QUERY
        INSERT INTO {{.Schema}}.events AS ev
               (global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at)
        SELECT v_first + e.ord - 1, e.id, p_streams[e.a], v_current[e.a] + e.i, e.t, e.d, nullif(e.m, '')::json, v_now
          FROM unnest(p_append, p_index, p_ids, p_types, v_data, p_metadata) WITH ORDINALITY AS e(a, i, id, t, d, m, ord)
         WHERE v_status[e.a] = 0
        RETURNING ev.stream_id, 0::smallint, ev.event_id, ev.global_sequence, ev.stream_version, NULL::bigint;

    v_void := pg_notify({{.Channel}}, (v_first + v_events - 1)::text);
END
$fn$;

-- append_one appends one event to p_stream if its version matches
-- p_expected (NULL any, -1 the stream exists, 0 no stream, N >= 1 exactly
-- N): append_batch for one append of one event, with scalar arguments and
-- the outcome in OUT parameters (status as in append_batch; global_sequence
-- and stream_version for status 0 and 3; actual_version for 1, 4 and 5).
-- p_check_id: whether the ID may be stored already (caller-chosen), which
-- makes an idempotent re-append answer status 3 with the stored position.
CREATE FUNCTION {{.Schema}}.append_one(
    p_stream text, p_expected bigint, p_id uuid, p_type text, p_data text, p_metadata text,
    p_check_id boolean,
    OUT status smallint, OUT global_sequence bigint, OUT stream_version bigint, OUT actual_version bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
DECLARE
    v_data           json;
    v_version        bigint;
    v_current        bigint;
    v_state          smallint;
    v_existing       int;
    v_matching       int;
    v_pos            bigint;
    v_stored_pos     bigint;
    v_stored_version bigint;
    v_now            timestamptz;
    v_step0          bigint;
    v_step           bigint;
    v_locked         boolean := false;
    -- The result of the calls made for their effect (the lock, NOTIFY),
    -- assigned rather than PERFORMed: an assignment is a PL/pgSQL simple
    -- expression, which starts no executor (PERFORM runs a SELECT through
    -- SPI); 3 µs of backend CPU per call, measured with pgbench.
    v_void           text;
BEGIN
    -- In append_batch's order: its arguments' shape (here: check_id), then
    -- the event's rules, then the stream's (event_input_bad can raise 22P02
    -- itself, casting metadata to jsonb: the order decides which error a
    -- call with two faults gets).
    IF p_check_id IS NULL THEN
        RAISE EXCEPTION 'annals: append_one: check_id must be true or false'
            USING ERRCODE = 'AN002', DETAIL = '{"event": 0, "field": "check_id"}';
    END IF;
    IF p_id IS NULL
       OR {{.Schema}}.event_input_bad(p_type, p_data, p_metadata) IS NOT FALSE
       OR {{.Schema}}.stream_input_bad(p_stream, p_expected, 1) THEN
        -- Raises AN002 with the DETAIL append_batch would give.
        PERFORM {{.Schema}}.append_batch_refuse(ARRAY[p_stream], ARRAY[p_expected], ARRAY[1], ARRAY[1], ARRAY[p_id],
                                                ARRAY[p_type], ARRAY[p_data], ARRAY[p_metadata]);
    END IF;
    status := 0;
    -- Parsed before the lock (the INSERT stores the text as is).
    v_data := p_data::json;

    -- Idempotency, looked up before the lock and again if an archive step
    -- ran in between, as in append_batch (0015, 0017).
    IF p_check_id THEN
        v_step0 := pg_sequence_last_value({{.ArchiveStepSequence}});
    END IF;
    LOOP
        IF p_check_id THEN
            -- The stored position comes with the look-up (an event_id is
            -- unique: max() is the one row's), so a re-append reads it once.
            SELECT count(*)::int, count(*) FILTER (WHERE x.stream_id = p_stream AND x.event_type = p_type
                                                     AND x.data::jsonb = p_data::jsonb)::int,
                   max(x.global_sequence), max(x.stream_version)
              INTO v_existing, v_matching, v_stored_pos, v_stored_version
              FROM {{.Schema}}.events_all x WHERE x.event_id = p_id;
            IF v_existing > 0 THEN
                status := CASE WHEN v_existing = 1 AND v_matching = 1 THEN 3 ELSE 2 END;
            END IF;
        END IF;
        EXIT WHEN v_locked;
        -- The log's ordering lock, held until commit (append_events, 0001).
        v_void := pg_advisory_xact_lock({{.AppendLockK1}}, {{.AppendLockK2}});
        v_locked := true;
        EXIT WHEN NOT p_check_id;
        v_step := pg_sequence_last_value({{.ArchiveStepSequence}});
        IF v_step IS NOT NULL AND NOT pg_visible_in_snapshot(v_step::text::xid8, pg_current_snapshot()) THEN
            RAISE EXCEPTION 'annals: events were archived after this transaction''s snapshot was taken; retry the append'
                USING ERRCODE = 'serialization_failure';
        END IF;
        EXIT WHEN v_step IS NOT DISTINCT FROM v_step0;
        status := 0;
    END LOOP;
    IF status = 3 THEN
        global_sequence := v_stored_pos;
        stream_version := v_stored_version;
        RETURN;
    END IF;

    v_now := clock_timestamp();
    IF status = 0 THEN
        -- The common case, a live stream whose expected version holds, in
        -- one statement: the row's version is advanced by one.
        UPDATE {{.Schema}}.streams AS s SET version = s.version + 1, updated_at = v_now
         WHERE s.stream_id = p_stream AND s.state = 0
           AND (p_expected IS NULL OR p_expected = -1 OR s.version = p_expected)
        RETURNING s.version INTO v_version;
    END IF;
    IF v_version IS NULL THEN
        -- A new stream, a deleted one, a wrong expected version, or an ID
        -- conflict (status 2, which reports the version too): the states as
        -- append_batch tells them apart.
        SELECT s.version, s.state INTO v_current, v_state
          FROM {{.Schema}}.streams AS s WHERE s.stream_id = p_stream;
        v_current := coalesce(v_current, 0);
        v_state := coalesce(v_state, 0);
        IF status = 0
           AND (v_state <> 0
                OR (p_expected = -1 AND v_current = 0)
                OR (p_expected >= 0 AND p_expected <> v_current)) THEN
            status := CASE WHEN v_state = 2 THEN 5
                           WHEN v_state = 1 AND p_expected IS DISTINCT FROM v_current THEN 4
                           WHEN v_state = 1 THEN 0 -- expects exactly its version: recreates it
                           ELSE 1 END;
        END IF;
        IF status <> 0 THEN
            actual_version := v_current;
            RETURN;
        END IF;
        v_version := v_current + 1;
        INSERT INTO {{.Schema}}.streams AS s (stream_id, version, created_at, updated_at)
        VALUES (p_stream, v_version, v_now, v_now)
        ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at, state = 0;
    END IF;

    -- Under the lock nobody else draws from the sequence.
    v_pos := nextval({{.EventsSequence}});
    INSERT INTO {{.Schema}}.events (global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at)
    VALUES (v_pos, p_id, p_stream, v_version, p_type, v_data, nullif(p_metadata, '')::json, v_now);
    global_sequence := v_pos;
    stream_version := v_version;
    v_void := pg_notify({{.Channel}}, v_pos::text);
END
$fn$;

REVOKE ALL ON FUNCTION {{.Schema}}.append_one(text, bigint, uuid, text, text, text, boolean) FROM PUBLIC;

-- Whoever may append through append_batch may append through append_one: an
-- upgraded database keeps its roles able to append from the Go client
-- (whose lone Store.Append calls append_one) without running annals grant
-- again.
DO $grants$
DECLARE
    v_schema constant text := {{.SchemaLiteral}};
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) AS who
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = pg_catalog.format('%I.append_batch(text[], bigint[], int[], int[], uuid[], text[], text[], text[], boolean)',
                                         v_schema)::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION %I.append_one(text, bigint, uuid, text, text, text, boolean) TO %s',
            v_schema, r.who);
    END LOOP;
END
$grants$;

COMMENT ON FUNCTION {{.Schema}}.append_one(text, bigint, uuid, text, text, text, boolean) IS
    'annals: the append of one event, with scalar arguments and an outcome as append_batch''s (status). See docs/sql-api.md.';
