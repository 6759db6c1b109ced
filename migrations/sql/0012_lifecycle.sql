-- annals schema: the life cycle of a stream: deletion (soft and hard).
--
-- A stream's row in streams gains a state: 0 live, 1 deleted (soft), 2
-- hard-deleted (a tombstone), and truncate_before, the first version reads
-- of the stream return (0 and 1: from the start). Deleting a stream appends
-- one event to it, of the reserved type "$stream.deleted" with data
-- {"hard": true|false}, so that projections and sagas can react; reads of
-- the stream then fail (ErrStreamDeleted) while the events stay in the log.
--
-- A deleted stream is recreated by an append that expects exactly its
-- current version (the caller has seen the deletion; any other expected
-- version is refused with AN005): its version continues, and reads start
-- after the deletion event. A hard-deleted stream refuses every append
-- (AN006), forever.
--
-- Event types starting with "$stream." are reserved: only these functions
-- write them. append_events, append_batch and append_batch_refuse are
-- redefined to check the state in the look-up of the stream row they
-- already make (no statement added to an append) and to refuse reserved
-- types; every other check, the DETAIL diagnostics, SECURITY DEFINER and the
-- pinned search_path are kept.

ALTER TABLE {{.Schema}}.streams
    ADD COLUMN state smallint NOT NULL DEFAULT 0 CHECK (state IN (0, 1, 2)),
    ADD COLUMN truncate_before bigint NOT NULL DEFAULT 0 CHECK (truncate_before >= 0);

COMMENT ON COLUMN {{.Schema}}.streams.state IS
    'annals: 0 live, 1 deleted (recreated by an append expecting exactly version), 2 hard-deleted (a tombstone: no more appends).';
COMMENT ON COLUMN {{.Schema}}.streams.truncate_before IS
    'annals: reads of the stream start at this version; events below it are left for the scavenger.';

-- append_events as in 0007 (and SECURITY DEFINER with a pinned search_path,
-- as 0008 set), plus: the stream's state is read with its version (the row
-- lookup it already made); appends to a hard-deleted stream fail with AN006,
-- to a deleted stream with AN005 unless the expected version is exactly the
-- stream's version (which recreates it); reserved types fail with AN002.
CREATE OR REPLACE FUNCTION {{.Schema}}.append_events(p_stream_id text, p_expected_version bigint, p_events jsonb)
RETURNS TABLE (event_id uuid, global_sequence bigint, stream_version bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
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
    v_state    smallint;
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
    -- Event types starting with "$stream." are written only by annals'
    -- lifecycle functions (delete_stream, set_stream_retention).
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_events) AS t(e) WHERE starts_with(t.e->>'type', '$stream.')) THEN
        RAISE EXCEPTION 'annals: event types starting with "$stream." are reserved for annals'
            USING ERRCODE = 'AN002', DETAIL = '{"event": 0, "field": "type"}';
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

    SELECT s.version, s.state INTO v_current, v_state
      FROM {{.Schema}}.streams s
     WHERE s.stream_id = p_stream_id
       FOR UPDATE;
    IF NOT FOUND THEN
        v_current := 0;
        v_state := 0;
    END IF;

    -- A tombstoned stream takes no appends; a soft-deleted one only an
    -- append that expects exactly its version (the caller has seen the
    -- deletion), which recreates it.
    IF v_state = 2 OR (v_state = 1 AND p_expected_version IS DISTINCT FROM v_current) THEN
        RAISE EXCEPTION 'annals: stream % is %', quote_literal(p_stream_id),
            CASE v_state WHEN 2 THEN 'hard-deleted (a tombstone): it can never be appended to again'
                         ELSE format('deleted; append with expected version %s to recreate it', v_current) END
            USING ERRCODE = CASE v_state WHEN 2 THEN 'AN006' ELSE 'AN005' END,
                  DETAIL = json_build_object('stream_id', p_stream_id, 'version', v_current,
                                             'hard', v_state = 2)::text;
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
           SET version = v_current + v_count, updated_at = v_now, state = 0
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

-- append_batch_refuse as in 0009, plus the rule on reserved types.
CREATE OR REPLACE FUNCTION {{.Schema}}.append_batch_refuse(
    p_streams text[], p_expected bigint[], p_append int[], p_index int[], p_ids uuid[],
    p_types text[], p_data text[], p_metadata text[])
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_appends int := cardinality(p_streams);
    v_events  int := cardinality(p_ids);
    v_name    constant text := E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$';
    v_field   text;
    v_why     text;
    v_limit   bigint;
    v_size    bigint;
    v_at      int := 0;
    v_append  int;
    i         int;
BEGIN
    FOR i IN 1 .. v_appends LOOP
        v_append := i;
        IF octet_length(p_streams[i]) > 512 THEN
            v_field := 'stream_id'; v_limit := 512; v_size := octet_length(p_streams[i]);
            v_why := format('is %s bytes; the limit is 512', v_size);
        ELSIF p_streams[i] IS NULL OR p_streams[i] !~ v_name THEN
            v_field := 'stream_id'; v_why := 'is empty, only white space, or holds a control character';
        ELSIF p_expected[i] < -1 THEN
            v_field := 'expected_version'; v_why := 'is below -1';
        ELSIF p_expected[i] > 9223372036854775807 - v_events THEN
            v_field := 'expected_version'; v_why := 'leaves no room for the events';
        ELSIF EXISTS (SELECT 1 FROM generate_series(1, i - 1) j WHERE p_streams[j] = p_streams[i]) THEN
            v_field := 'stream_id'; v_why := 'appears in two appends of one call';
        END IF;
        EXIT WHEN v_field IS NOT NULL;
    END LOOP;
    IF v_field IS NULL THEN
        v_append := NULL;
        FOR i IN 1 .. v_events LOOP
            v_at := i;
            v_append := p_append[i];
            IF p_append[i] IS NULL OR p_index[i] IS NULL
               OR (CASE WHEN i = 1 THEN p_append[i] <> 1 OR p_index[i] <> 1
                        WHEN p_append[i] = p_append[i - 1] THEN p_index[i] <> p_index[i - 1] + 1
                        ELSE p_append[i] <> p_append[i - 1] + 1 OR p_index[i] <> 1 END)
               OR (i = v_events AND p_append[i] <> v_appends) THEN
                v_field := 'index'; v_why := 'breaks the order: events go append by append (1..n), numbered 1, 2, ... within each';
            ELSIF p_ids[i] IS NULL OR EXISTS (SELECT 1 FROM generate_series(1, i - 1) j WHERE p_ids[j] = p_ids[i]) THEN
                v_field := 'event_id'; v_why := 'is missing or appears twice in one call';
            ELSIF octet_length(p_types[i]) > 256 THEN
                v_field := 'type'; v_limit := 256; v_size := octet_length(p_types[i]);
                v_why := format('is %s bytes; the limit is 256', v_size);
            ELSIF p_types[i] IS NULL OR p_types[i] !~ v_name THEN
                v_field := 'type'; v_why := 'is empty, only white space, or holds a control character';
            ELSIF starts_with(p_types[i], '$stream.') THEN
                v_field := 'type'; v_why := 'starts with "$stream.", which is reserved for annals';
            ELSIF octet_length(p_data[i]) + coalesce(octet_length(p_metadata[i]), 0) > 67108864 THEN
                v_field := 'data+metadata'; v_limit := 67108864;
                v_size := octet_length(p_data[i]) + coalesce(octet_length(p_metadata[i]), 0);
                v_why := format('is %s bytes; the limit is 67108864 (64 MiB)', v_size);
            ELSIF p_data[i] IS NULL OR left(ltrim(p_data[i], E' \t\r\n'), 1) NOT IN ('{', '[') THEN
                v_field := 'data'; v_why := 'is not a JSON object or array';
            ELSIF NOT {{.Schema}}.jsonb_storable(p_data[i]) THEN
                v_field := 'data'; v_why := 'is not JSON that jsonb can hold (a NUL character escape or an unpaired surrogate)';
            ELSIF coalesce(p_metadata[i], '') <> ''
                  AND (left(ltrim(p_metadata[i], E' \t\r\n'), 1) <> '{' OR NOT {{.Schema}}.jsonb_storable(p_metadata[i])) THEN
                v_field := 'metadata'; v_why := 'is not a JSON object that jsonb can hold';
            ELSIF coalesce(p_metadata[i], '') <> '' AND NOT {{.Schema}}.metadata_ok(p_metadata[i]::jsonb) THEN
                v_field := 'metadata';
                v_why := 'has a key over 256 bytes, or a reserved key of the wrong type (correlation_id, causation_id, traceparent, tracestate: strings; schema_version: a positive integer)';
            END IF;
            EXIT WHEN v_field IS NOT NULL;
        END LOOP;
        IF v_field IS NULL THEN
            v_at := 0; v_append := NULL;
            v_field := 'index'; v_why := 'leaves an append without events';
        END IF;
    END IF;
    RAISE EXCEPTION 'annals: append_batch: % %', v_field, v_why
        USING ERRCODE = 'AN002',
              DETAIL = json_build_object('event', v_at, 'append', v_append, 'field', v_field,
                                         'limit', v_limit, 'actual', v_size)::text;
END
$fn$;

-- append_batch as in 0009, plus: the stream look-up reads each stream's
-- state too; status 4 (deleted; actual_version is its version) and 5
-- (hard-deleted) are per-append outcomes like 1 and 2; a recreating append
-- sets the state back to live; reserved types fail the call with AN002.
CREATE OR REPLACE FUNCTION {{.Schema}}.append_batch(
    p_streams text[], p_expected bigint[], p_append int[], p_index int[], p_ids uuid[],
    p_types text[], p_data text[], p_metadata text[], p_check_ids boolean)
RETURNS TABLE (stream_id text, status smallint, event_id uuid, global_sequence bigint,
               stream_version bigint, actual_version bigint)
LANGUAGE plpgsql
-- Like append_events, it runs with its owner's rights and a pinned
-- search_path: it is the only way for other roles to write the log
-- (migrations.Grant gives EXECUTE to writers, runners and operators).
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- The statements below are planned once per session: planning them anew for
-- each call (a custom plan) would cost more than running them. A plan made
-- while the tables were small could scan them where an index lookup is
-- meant, and stay cached while they grow (measured: a fresh schema's
-- appends with caller-chosen IDs slowed to a third as the log grew). Every
-- lookup here is by key, so sequential scans are off for these statements.
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
    v_failed   boolean := false;
    v_first    bigint;
    v_now      timestamptz;
    v_data     json[];
    i          int;
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
    -- Everything else the arguments must satisfy, in one statement: the
    -- input limits of check_event_input (stream IDs of 1..512 and types of
    -- 1..256 bytes with no control character and not only white space,
    -- metadata keys of at most 256 bytes and reserved keys of the right
    -- type, at most 64 MiB of data and metadata per event, nothing jsonb
    -- cannot hold); streams and event IDs distinct; expected versions valid;
    -- events listed append by append (1, 2, ... n) and numbered 1, 2, ...
    -- within each; data a JSON object or array and metadata a JSON object
    -- by their first character (the json casts of the INSERT check the rest
    -- of the syntax, and abort everything if it is wrong). It also counts
    -- each append's events. Which rule was broken is worked out only when
    -- one was (append_batch_refuse).
    SELECT bool_or(e.a IS NULL OR e.i IS NULL OR e.id IS NULL OR e.t IS NULL OR e.d IS NULL
                   OR CASE WHEN e.ord = 1 THEN e.a <> 1 OR e.i <> 1
                           WHEN e.a = p_append[e.ord - 1] THEN e.i <> p_index[e.ord - 1] + 1
                           ELSE e.a <> p_append[e.ord - 1] + 1 OR e.i <> 1 END
                   OR starts_with(e.t, '$stream.')
                   OR NOT (octet_length(e.t) <= 256 AND e.t ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$')
                   OR left(ltrim(e.d, E' \t\r\n'), 1) NOT IN ('{', '[')
                   OR octet_length(e.d) + coalesce(octet_length(e.m), 0) > 67108864
                   OR (strpos(e.d, E'\\u') > 0 AND NOT {{.Schema}}.jsonb_storable(e.d))
                   OR (e.m IS NOT NULL AND e.m <> ''
                       AND (left(ltrim(e.m, E' \t\r\n'), 1) <> '{'
                            OR (strpos(e.m, E'\\u') > 0 AND NOT {{.Schema}}.jsonb_storable(e.m))
                            OR NOT {{.Schema}}.metadata_ok(e.m::jsonb))))
           OR max(e.a) <> v_appends
           OR count(DISTINCT e.id) <> v_events
           OR EXISTS (SELECT 1 FROM unnest(p_streams, p_expected) AS a(s, x)
                       WHERE a.s IS NULL OR a.x < -1 OR a.x > 9223372036854775807 - v_events
                          OR NOT (octet_length(a.s) <= 512 AND a.s ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$'))
           OR (SELECT count(DISTINCT a.s) FROM unnest(p_streams) AS a(s)) <> v_appends,
           array_agg(e.i ORDER BY e.ord) FILTER (WHERE e.ord = v_events OR p_append[e.ord + 1] <> e.a)
      INTO v_bad, v_count
      FROM unnest(p_append, p_index, p_ids, p_types, p_data, p_metadata) WITH ORDINALITY AS e(a, i, id, t, d, m, ord);
    IF v_bad IS NOT FALSE OR cardinality(v_count) IS DISTINCT FROM v_appends THEN
        PERFORM {{.Schema}}.append_batch_refuse(p_streams, p_expected, p_append, p_index, p_ids, p_types, p_data, p_metadata);
    END IF;

    v_status := array_fill(0::smallint, ARRAY[v_appends]);
    -- Parse the payloads before the lock too (the INSERT stores them as is).
    v_data := p_data::json[];

    -- Idempotency: an append whose events are all stored (same IDs, stream,
    -- type and data) is answered with the stored positions (status 3); one
    -- that is partly stored, or stored with other content, fails (status 2).
    -- This is looked up before the lock, to keep the lock short: the log is
    -- append-only, so what is found stored now is still stored under the
    -- lock. An event stored in between by a concurrent append of the same
    -- ID makes the INSERT below fail on the event_id key, which aborts the
    -- whole call; the Go client then sends each append alone through
    -- append_events, which decides under the lock.
    IF p_check_ids THEN
        -- One index probe per event (LATERAL on the unique event_id), so
        -- the plan cannot turn into a scan of the log.
        SELECT array_agg(coalesce(x.existing, 0) ORDER BY g.n), array_agg(coalesce(x.matching, 0) ORDER BY g.n)
          INTO v_existing, v_matching
          FROM generate_series(1, v_appends) AS g(n)
          LEFT JOIN (SELECT e.a, count(*)::int AS existing,
                            count(*) FILTER (WHERE ev.stream_id = p_streams[e.a] AND ev.event_type = e.t
                                               AND ev.data::jsonb = e.d::jsonb)::int AS matching
                       FROM unnest(p_append, p_ids, p_types, p_data) AS e(a, id, t, d)
                       CROSS JOIN LATERAL (SELECT x.stream_id, x.event_type, x.data
                                             FROM {{.Schema}}.events x WHERE x.event_id = e.id) ev
                      GROUP BY e.a) x ON x.a = g.n;
        FOR i IN 1 .. v_appends LOOP
            IF v_existing[i] > 0 THEN
                v_status[i] := CASE WHEN v_existing[i] = v_count[i] AND v_matching[i] = v_count[i] THEN 3 ELSE 2 END;
                v_failed := true;
            END IF;
        END LOOP;
    END IF;

    -- Serialize the numbering (the same lock as append_events) before the
    -- streams are read: what the statements below read is then current, and
    -- positions become visible in commit order.
    PERFORM pg_advisory_xact_lock({{.AppendLockK1}}, {{.AppendLockK2}});

    -- Each stream's version and state, in the one look-up of the streams
    -- table an append makes (state: 0 live, 1 deleted, 2 hard-deleted).
    SELECT array_agg(coalesce(s.version, 0) ORDER BY a.n), array_agg(coalesce(s.state, 0::smallint) ORDER BY a.n)
      INTO v_current, v_state
      FROM unnest(p_streams) WITH ORDINALITY AS a(id, n)
      LEFT JOIN {{.Schema}}.streams s ON s.stream_id = a.id;

    -- Stream states and expected versions: status 5 for a hard-deleted
    -- stream, 4 for a deleted one unless the append expects exactly its
    -- version (which recreates it), 1 when the expected version does not
    -- hold.
    -- (One test in the common case, a live stream whose expected version
    -- holds: the states are told apart only when the test fails.)
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
                                    FROM {{.Schema}}.events x WHERE x.event_id = e.id) ev
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

    -- Under the lock nobody else draws from the sequence, so the block
    -- [v_first, v_first + v_events) is ours: positions follow the order of the
    -- events in the arguments.
    v_first := nextval({{.EventsSequence}});
    IF v_events > 1 THEN
        PERFORM setval({{.EventsSequence}}, v_first + v_events - 1);
    END IF;

    RETURN QUERY
        INSERT INTO {{.Schema}}.events AS ev
               (global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at)
        SELECT v_first + e.ord - 1, e.id, p_streams[e.a], v_current[e.a] + e.i, e.t, e.d, nullif(e.m, '')::json, v_now
          FROM unnest(p_append, p_index, p_ids, p_types, v_data, p_metadata) WITH ORDINALITY AS e(a, i, id, t, d, m, ord)
         WHERE v_status[e.a] = 0
        RETURNING ev.stream_id, 0::smallint, ev.event_id, ev.global_sequence, ev.stream_version, NULL::bigint;

    PERFORM pg_notify({{.Channel}}, (v_first + v_events - 1)::text);
END
$fn$;

-- delete_stream deletes p_stream_id: appends one "$stream.deleted" event
-- ({"hard": p_hard}) with p_metadata (a JSON object or NULL) at the next
-- version, and marks the stream deleted (p_hard false) or hard-deleted
-- (true). p_expected_version is as in append_events (NULL any, -1 stream
-- exists, N exact); the stream must exist (else AN001, actual 0). A
-- hard-deleted stream fails with AN006; deleting a deleted stream again
-- fails with AN005 unless p_hard, which turns it into a tombstone.
-- Returns the deletion event's (event_id, global_sequence, stream_version).
CREATE FUNCTION {{.Schema}}.delete_stream(p_stream_id text, p_expected_version bigint, p_hard boolean,
                                          p_metadata jsonb DEFAULT NULL)
RETURNS TABLE (event_id uuid, global_sequence bigint, stream_version bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_current bigint;
    v_state   smallint;
    v_seq     bigint;
    v_id      uuid := gen_random_uuid();
    v_now     timestamptz;
BEGIN
    IF p_hard IS NULL THEN
        RAISE EXCEPTION 'annals: delete_stream: hard must be true or false' USING ERRCODE = 'AN002',
            DETAIL = '{"event": 0, "field": "hard"}';
    END IF;
    IF p_expected_version = 0 OR p_expected_version < -1 THEN
        RAISE EXCEPTION 'annals: delete_stream: expected version must be NULL (any), -1 (stream exists) or a version >= 1; got %',
            p_expected_version USING ERRCODE = 'AN002',
            DETAIL = '{"event": 0, "field": "expected_version"}';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) = 'null' THEN
        p_metadata := NULL;
    END IF;
    IF p_metadata IS NOT NULL AND NOT {{.Schema}}.metadata_ok(p_metadata) THEN
        RAISE EXCEPTION 'annals: delete_stream: metadata must be a JSON object with well-typed reserved keys' USING ERRCODE = 'AN002',
            DETAIL = '{"event": 1, "field": "metadata"}';
    END IF;
    PERFORM {{.Schema}}.check_event_input(p_stream_id, p_expected_version,
        jsonb_build_array(jsonb_build_object('type', '$stream.deleted', 'data', '{}'::jsonb, 'metadata', p_metadata)));

    PERFORM pg_advisory_xact_lock({{.AppendLockK1}}, {{.AppendLockK2}});

    SELECT s.version, s.state INTO v_current, v_state
      FROM {{.Schema}}.streams s
     WHERE s.stream_id = p_stream_id
       FOR UPDATE;
    IF NOT FOUND THEN
        v_current := 0;
        v_state := 0;
    END IF;
    IF v_state = 2 OR (v_state = 1 AND NOT p_hard) THEN
        RAISE EXCEPTION 'annals: stream % is already %', quote_literal(p_stream_id),
            CASE v_state WHEN 2 THEN 'hard-deleted' ELSE 'deleted' END
            USING ERRCODE = CASE v_state WHEN 2 THEN 'AN006' ELSE 'AN005' END,
                  DETAIL = json_build_object('stream_id', p_stream_id, 'version', v_current,
                                             'hard', v_state = 2)::text;
    END IF;
    IF v_current = 0
       OR (p_expected_version >= 1 AND p_expected_version <> v_current) THEN
        RAISE EXCEPTION 'annals: wrong expected version for stream %: expected %, actual %',
            quote_literal(p_stream_id),
            CASE p_expected_version WHEN -1 THEN 'stream exists' ELSE coalesce(p_expected_version::text, 'any') END,
            v_current
            USING ERRCODE = 'AN001',
                  DETAIL = json_build_object('stream_id', p_stream_id,
                                             'expected_version', p_expected_version,
                                             'actual_version', v_current)::text;
    END IF;

    v_now := clock_timestamp();
    UPDATE {{.Schema}}.streams
       SET version = v_current + 1, updated_at = v_now,
           state = CASE WHEN p_hard THEN 2 ELSE 1 END,
           truncate_before = greatest(truncate_before, v_current + 2)
     WHERE stream_id = p_stream_id;

    v_seq := nextval({{.EventsSequence}});
    INSERT INTO {{.Schema}}.events
           (global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at)
    VALUES (v_seq, v_id, p_stream_id, v_current + 1, '$stream.deleted',
            CASE WHEN p_hard THEN '{"hard":true}' ELSE '{"hard":false}' END::json, p_metadata::json, v_now);

    PERFORM pg_notify({{.Channel}}, v_seq::text);
    RETURN QUERY SELECT v_id, v_seq, v_current + 1;
END
$fn$;

REVOKE ALL ON FUNCTION {{.Schema}}.delete_stream(text, bigint, boolean, jsonb) FROM PUBLIC;

COMMENT ON FUNCTION {{.Schema}}.delete_stream(text, bigint, boolean, jsonb) IS
    'annals: delete a stream (soft, or hard: a tombstone) by appending a "$stream.deleted" event; returns (event_id, global_sequence, stream_version). See docs/sql-api.md.';


-- Retention. Per stream: max_age (events recorded longer ago are hidden
-- from stream reads at once and removed by the scavenger), max_count (only
-- the newest max_count versions are kept) and truncate_before (above).
-- Changing them appends a "$stream.truncated" event to the stream's
-- metadata stream "$$<stream_id>" (the stream's own versions are left
-- alone), so projections learn that events may vanish.
ALTER TABLE {{.Schema}}.streams
    ADD COLUMN max_age interval CHECK (max_age > interval '0'),
    ADD COLUMN max_count bigint CHECK (max_count > 0);

-- One row per scavenge run: who started it, when, the range of positions
-- it scans, how far it got and how many events it removed. A run is
-- resumable: it is advanced one batch (one transaction) at a time by
-- scavenge(), and an unfinished run is continued by the next call, whoever
-- makes it. now_at is the retention clock of the whole run.
CREATE TABLE {{.Schema}}.scavenge_runs (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_by      text        NOT NULL,
    instance        text,
    started_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at     timestamptz,
    now_at          timestamptz NOT NULL,
    from_position   bigint      NOT NULL,
    scanned_to      bigint      NOT NULL,
    target_position bigint      NOT NULL,
    removed         bigint      NOT NULL DEFAULT 0,
    steps           int         NOT NULL DEFAULT 0,
    -- the transaction of the step in progress: the events trigger lets
    -- exactly that transaction delete
    step_xact       xid8
);

CREATE UNIQUE INDEX scavenge_runs_one_open ON {{.Schema}}.scavenge_runs ((true)) WHERE finished_at IS NULL;
CREATE INDEX scavenge_runs_step ON {{.Schema}}.scavenge_runs (step_xact) WHERE step_xact IS NOT NULL;

COMMENT ON TABLE {{.Schema}}.scavenge_runs IS
    'annals: every scavenge run: who, when, the positions scanned and the events removed. Written only by scavenge().';

-- The append-only trigger as before, except for the DELETE of a scavenge
-- step, recognised by its transaction ID recorded in scavenge_runs (which
-- only scavenge() writes). Every other UPDATE, DELETE or TRUNCATE is
-- refused, whoever runs it.
CREATE OR REPLACE FUNCTION {{.Schema}}.events_append_only() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF TG_OP = 'DELETE'
       AND EXISTS (SELECT 1 FROM {{.Schema}}.scavenge_runs r
                    WHERE r.step_xact = pg_current_xact_id() AND r.finished_at IS NULL) THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'annals: the events table is append-only; % is not allowed', TG_OP
        USING ERRCODE = 'AN004',
              HINT = 'Events are facts: append a compensating event instead (or delete a stream with delete_stream and let scavenge() remove it).';
END
$fn$;
REVOKE ALL ON FUNCTION {{.Schema}}.events_append_only() FROM PUBLIC;

-- scavenge advances the open scavenge run by one batch of p_batch positions
-- (starting a run if none is open: from the oldest stored position to the
-- head, with p_now, or the server's clock when NULL, as its retention
-- clock) and removes, in that range, the events of hard-deleted streams and
-- every event below its stream's truncate_before, beyond its max_count or
-- older than its max_age. Returns the run's progress; done when the run
-- finished with this batch. Steps and retention changes are serialized by
-- a transaction-scoped advisory lock, so a step never removes an event that
-- a retention change committed before it keeps. Call it as a statement of
-- its own, in a loop, until done.
CREATE FUNCTION {{.Schema}}.scavenge(p_instance text, p_now timestamptz, p_batch int)
RETURNS TABLE (run_id bigint, started_by text, started_at timestamptz, now_at timestamptz,
               from_position bigint, scanned_to bigint, target_position bigint, removed bigint,
               steps int, done boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    r     record;
    v_to  bigint;
    v_n   bigint;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 THEN
        RAISE EXCEPTION 'annals: scavenge: batch must be at least 1' USING ERRCODE = 'AN002',
            DETAIL = '{"event": 0, "field": "batch"}';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended({{.SchemaLiteral}} || ':scavenge', 0));

    SELECT * INTO r FROM {{.Schema}}.scavenge_runs x WHERE x.finished_at IS NULL FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO {{.Schema}}.scavenge_runs AS x (started_by, instance, now_at, from_position, scanned_to, target_position)
        SELECT session_user, p_instance, coalesce(p_now, clock_timestamp()),
               coalesce(min(e.global_sequence) - 1, 0), coalesce(min(e.global_sequence) - 1, 0),
               coalesce(max(e.global_sequence), 0)
          FROM {{.Schema}}.events e
        RETURNING * INTO r;
    END IF;

    v_to := least(r.scanned_to + p_batch, r.target_position);
    UPDATE {{.Schema}}.scavenge_runs x SET step_xact = pg_current_xact_id() WHERE x.id = r.id;
    DELETE FROM {{.Schema}}.events e
     USING {{.Schema}}.streams s
     WHERE e.global_sequence > r.scanned_to AND e.global_sequence <= v_to
       AND s.stream_id = e.stream_id
       AND (s.state = 2
            OR e.stream_version < s.truncate_before
            OR e.stream_version <= s.version - s.max_count
            OR e.recorded_at < r.now_at - s.max_age);
    GET DIAGNOSTICS v_n = ROW_COUNT;

    RETURN QUERY
    UPDATE {{.Schema}}.scavenge_runs x
       SET step_xact = NULL, scanned_to = v_to, removed = x.removed + v_n, steps = x.steps + 1,
           updated_at = clock_timestamp(),
           finished_at = CASE WHEN v_to >= x.target_position THEN clock_timestamp() END
     WHERE x.id = r.id
    RETURNING x.id, x.started_by, x.started_at, x.now_at, x.from_position, x.scanned_to, x.target_position,
              x.removed, x.steps, x.finished_at IS NOT NULL;
END
$fn$;

REVOKE ALL ON FUNCTION {{.Schema}}.scavenge(text, timestamptz, int) FROM PUBLIC;

COMMENT ON FUNCTION {{.Schema}}.scavenge(text, timestamptz, int) IS
    'annals: one step of the scavenge run (removes expired, truncated and hard-deleted events in a batch of positions; records the run in scavenge_runs). See docs/sql-api.md.';

-- set_stream_retention sets p_stream_id's max age and max count (NULL:
-- unchanged; interval '0' and 0: no limit) and raises its truncate_before
-- to p_truncate_before (NULL or lower: unchanged; at most version + 1),
-- and appends a "$stream.truncated" event with the new settings
-- ({"stream_id", "truncate_before", "max_age_seconds", "max_count"}) to
-- the stream "$$<stream_id>". Stream reads honour the new settings at once;
-- the scavenger removes the rows later. Returns the stream's settings.
CREATE FUNCTION {{.Schema}}.set_stream_retention(p_stream_id text, p_max_age interval, p_max_count bigint,
                                                 p_truncate_before bigint)
RETURNS TABLE (version bigint, state smallint, truncate_before bigint, max_age interval, max_count bigint,
               event_id uuid, global_sequence bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    s      record;
    v_meta text := '$$' || p_stream_id;
    v_mver bigint;
    v_seq  bigint;
    v_id   uuid := gen_random_uuid();
    v_now  timestamptz;
BEGIN
    IF p_max_age < interval '0' OR p_max_count < 0 OR p_truncate_before < 0 THEN
        RAISE EXCEPTION 'annals: set_stream_retention: max_age, max_count and truncate_before must not be negative'
            USING ERRCODE = 'AN002', DETAIL = '{"event": 0, "field": "retention"}';
    END IF;
    PERFORM {{.Schema}}.check_event_input(v_meta, NULL,
        jsonb_build_array(jsonb_build_object('type', '$stream.truncated', 'data', '{}'::jsonb)));
    -- Wait for a scavenge step in progress: it decided with the settings
    -- that were committed when it started.
    PERFORM pg_advisory_xact_lock_shared(hashtextextended({{.SchemaLiteral}} || ':scavenge', 0));
    PERFORM pg_advisory_xact_lock({{.AppendLockK1}}, {{.AppendLockK2}});

    UPDATE {{.Schema}}.streams x
       SET max_age = CASE WHEN p_max_age IS NULL THEN x.max_age WHEN p_max_age = interval '0' THEN NULL ELSE p_max_age END,
           max_count = CASE WHEN p_max_count IS NULL THEN x.max_count WHEN p_max_count = 0 THEN NULL ELSE p_max_count END,
           truncate_before = CASE WHEN p_truncate_before IS NULL THEN x.truncate_before
                                  ELSE greatest(x.truncate_before, least(p_truncate_before, x.version + 1)) END
     WHERE x.stream_id = p_stream_id
    RETURNING x.version, x.state, x.truncate_before, x.max_age, x.max_count INTO s;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'annals: stream % does not exist', quote_literal(p_stream_id)
            USING ERRCODE = 'AN001',
                  DETAIL = json_build_object('stream_id', p_stream_id, 'expected_version', -1, 'actual_version', 0)::text;
    END IF;

    v_now := clock_timestamp();
    INSERT INTO {{.Schema}}.streams AS x (stream_id, version, created_at, updated_at)
    VALUES (v_meta, 1, v_now, v_now)
    ON CONFLICT (stream_id) DO UPDATE SET version = x.version + 1, updated_at = v_now
    RETURNING x.version INTO v_mver;
    v_seq := nextval({{.EventsSequence}});
    INSERT INTO {{.Schema}}.events
           (global_sequence, event_id, stream_id, stream_version, event_type, data, recorded_at)
    VALUES (v_seq, v_id, v_meta, v_mver, '$stream.truncated',
            json_build_object('stream_id', p_stream_id, 'truncate_before', s.truncate_before,
                              'max_age_seconds', extract(epoch FROM s.max_age)::float8, 'max_count', s.max_count),
            v_now);
    PERFORM pg_notify({{.Channel}}, v_seq::text);
    RETURN QUERY SELECT s.version, s.state, s.truncate_before, s.max_age, s.max_count, v_id, v_seq;
END
$fn$;

REVOKE ALL ON FUNCTION {{.Schema}}.set_stream_retention(text, interval, bigint, bigint) FROM PUBLIC;

COMMENT ON FUNCTION {{.Schema}}.set_stream_retention(text, interval, bigint, bigint) IS
    'annals: set a stream''s max age, max count and truncate-before; appends "$stream.truncated" to "$$<stream>". See docs/sql-api.md.';

-- Whoever may append through append_batch may delete streams and set their
-- retention: upgraded databases keep their writers as capable as annals
-- grant makes new ones. (scavenge() is for operators: run `annals grant
-- operator ROLE` again after upgrading.)
DO $grants$
DECLARE
    v_schema constant text := {{.SchemaLiteral}};
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) AS who
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = pg_catalog.format('%I.append_batch(text[], bigint[], int[], int[], uuid[], text[], text[], text[], boolean)', v_schema)::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.delete_stream(text, bigint, boolean, jsonb) TO %s',
                                  v_schema, r.who);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.set_stream_retention(text, interval, bigint, bigint) TO %s',
                                  v_schema, r.who);
    END LOOP;
END
$grants$;
