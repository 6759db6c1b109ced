-- annals schema: appends made in a transaction store their events as
-- written.
--
-- append_events takes its events as jsonb, and stores each event's data and
-- metadata as jsonb renders them: keys sorted, a duplicate key's last value
-- kept, 1e2 as 100, 1e131000 as its 131,001 digits. The Go client sent
-- every append made in a transaction through it (AppendTx, Transact and its
-- Batch, the encoded appends of the scheduler's timers, inline projections'
-- appends) and the one-by-one re-send of a failed group, while its group
-- commit (append_batch, append_one, which take text) stores the bytes as
-- sent. So the same event was stored in two spellings, an auditor's hash of
-- a payload matched or not by the path it came through, and a 1.5 KB event
-- of 100 numbers 1e131000 was stored as 13 MB, far past the MaxEventBytes
-- the client had measured it against. And a number beyond numeric's range
-- ({"n": 1e200000}), which append_one stores (0032: only personal data is
-- refused), failed such an append with a bare 22003 before the function ran.
--
-- append_events_json is append_events taking json: the elements of the
-- array are read with json's functions, which return each value's own text
-- (json_to_record keeps the last value of a key given twice, as jsonb
-- does), and data and metadata are stored as written. Otherwise it is
-- append_events as of 0019: the same checks of the array's form, messages
-- and codes, the same idempotency (looked up under the ordering lock, with
-- the archive step check), the same handling of deleted streams, expected
-- versions and NOTIFY. The input limits are those append_one and
-- append_batch apply to text (stream_input_bad, event_input_bad: sizes are
-- of the text as written, and data jsonb cannot hold is refused only when it
-- is personal, as 0032 says); a refusal is explained by append_batch_refuse,
-- its message reworded as check_event_input words it ("annals: event 2 of 3
-- type is ..."), with the same DETAIL. A re-append compares data as text
-- first, and as jsonb only when the texts differ (an event stored through
-- append_events is in jsonb's spelling), never casting a text jsonb cannot
-- hold. Unlike jsonb's, json's functions parse the text at every call, so
-- one statement reads every element once (json_to_record) into arrays the
-- rest of the function uses; an element's keys are listed only when it is
-- not its fields' texts in the Go client's order. A \u0000 or an unpaired
-- surrogate escape anywhere in an element still fails the call with 22P05
-- or 22P02, as in append_events (json_to_record unescapes strings).
--
-- metadata_ok is redefined without a sub-select in the expression it
-- returns (below), which made every call of it start an executor: the
-- input rules on text cost append_events_json more than check_event_input
-- costs append_events on a parsed jsonb, and metadata_ok was most of the
-- difference. With it, Transact costs what it did through append_events
-- (0.99-1.05x for 1 and 10 events of 300 bytes, 0.89-0.94x for 100, fsync
-- on); the function alone, in one statement without IDs, 1.16-1.27x, all
-- of it before the ordering lock (docs/benchmarks.md).
--
-- append_events stays as it is: the documented SQL API for other languages
-- (docs/sql-api.md), which now says that it stores jsonb's normal form.
-- Whoever may execute append_events may execute append_events_json (the DO
-- block below), so roles granted before keep appending from the Go client.

-- metadata_keys_ok reports whether every top-level key of the object p_md
-- is at most 256 bytes: metadata_ok's key rule, asked only of metadata
-- whose stored size could hold a longer key. PL/pgSQL for the reason 0016
-- gives (a SQL function with a sub-select is planned at every call).
CREATE FUNCTION {{.Schema}}.metadata_keys_ok(p_md jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $fn$
BEGIN
    RETURN NOT EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_md) k
                        WHERE pg_catalog.octet_length(k) > 256);
END
$fn$;

-- metadata_ok as in 0016, its key rule in metadata_keys_ok: the expression
-- it returns holds no sub-select, so PL/pgSQL evaluates it as a simple
-- expression, which starts no executor. The sub-select ran an executor at
-- every call, the small metadata of nearly every event included: 6.8 µs a
-- call against 1.2 (20,000 calls of {"correlation_id": ..., "tenant": ...}),
-- paid by every event with metadata that append_one, append_batch and
-- append_events_json take. Same rules, same result.
CREATE OR REPLACE FUNCTION {{.Schema}}.metadata_ok(p_md jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $fn$
BEGIN
    RETURN pg_catalog.jsonb_typeof(p_md) = 'object'
       AND coalesce(pg_catalog.jsonb_typeof(p_md OPERATOR(pg_catalog.->) 'correlation_id'), 'string') = 'string'
       AND coalesce(pg_catalog.jsonb_typeof(p_md OPERATOR(pg_catalog.->) 'causation_id'), 'string') = 'string'
       AND coalesce(pg_catalog.jsonb_typeof(p_md OPERATOR(pg_catalog.->) 'traceparent'), 'string') = 'string'
       AND coalesce(pg_catalog.jsonb_typeof(p_md OPERATOR(pg_catalog.->) 'tracestate'), 'string') = 'string'
       AND CASE WHEN p_md OPERATOR(pg_catalog.->) 'schema_version' IS NULL THEN true
                WHEN pg_catalog.jsonb_typeof(p_md OPERATOR(pg_catalog.->) 'schema_version') = 'number'
                THEN (p_md OPERATOR(pg_catalog.->>) 'schema_version')::numeric BETWEEN 1 AND 2147483647
                     AND (p_md OPERATOR(pg_catalog.->>) 'schema_version')::numeric
                         = pg_catalog.trunc((p_md OPERATOR(pg_catalog.->>) 'schema_version')::numeric)
                ELSE false END
       AND (pg_catalog.pg_column_size(p_md) <= 256 OR {{.Schema}}.metadata_keys_ok(p_md));
END
$fn$;

CREATE FUNCTION {{.Schema}}.append_events_json(p_stream_id text, p_expected_version bigint, p_events json)
RETURNS TABLE (event_id uuid, global_sequence bigint, stream_version bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
#variable_conflict use_column
DECLARE
    v_count    int;
    v_bad_ords bigint[];
    v_bad_whys text[];
    v_bad_ord  bigint;
    v_bad_why  text;
    v_ords     bigint[];
    v_ids      uuid[];
    v_given    boolean[];
    v_types    text[];
    v_data     json[];
    v_meta     json[];
    v_with_ids int;
    v_distinct int;
    v_input_bad boolean;
    v_existing int;
    v_matching int;
    v_current  bigint;
    v_first    bigint;
    v_now      timestamptz;
    v_state    smallint;
    v_step     bigint;
    v_msg      text;
    v_detail   text;
    v_event    int;
BEGIN
    IF p_stream_id IS NULL OR p_stream_id = '' THEN
        RAISE EXCEPTION 'annals: stream_id must not be empty' USING ERRCODE = 'AN002';
    END IF;
    IF p_expected_version < -1 THEN
        RAISE EXCEPTION 'annals: expected_version must be NULL (any), 0 (no stream), -1 (stream exists) or a version >= 1; got %',
            p_expected_version USING ERRCODE = 'AN002';
    END IF;
    -- json_typeof reads the first token only.
    IF p_events IS NULL OR json_typeof(p_events) <> 'array' THEN
        RAISE EXCEPTION 'annals: events must be a non-empty JSON array' USING ERRCODE = 'AN002';
    END IF;

    -- One statement over the elements: each one's fields as written, with
    -- its place (ord; the arrays are aligned with each other, and ordered
    -- by ord only where order matters: the insert and the answers, not by
    -- a sort per array); the elements that break append_events' rules of
    -- form, with the reasons append_events gives; how many carry an ID,
    -- and how many distinct ones; and whether an element breaks an input
    -- rule (event_input_bad, asked only of elements of the right form). An
    -- element that is not an object has no fields (json_to_record refuses
    -- it). IDs not given are drawn here.
    SELECT count(*)::int,
           array_agg(x.ord) FILTER (WHERE x.why IS NOT NULL),
           array_agg(x.why) FILTER (WHERE x.why IS NOT NULL),
           count(*) FILTER (WHERE x.why IS NULL AND x.given),
           count(DISTINCT x.idt::uuid) FILTER (WHERE x.why IS NULL AND x.given),
           bool_or(CASE WHEN x.why IS NULL THEN {{.Schema}}.event_input_bad(x.ty, x.dt, x.mt) IS NOT FALSE END),
           array_agg(x.ord),
           array_agg(CASE WHEN x.why IS NULL AND x.given THEN x.idt::uuid ELSE gen_random_uuid() END),
           array_agg(x.given),
           array_agg(x.ty),
           array_agg(x.d),
           array_agg(x.m)
      INTO v_count, v_bad_ords, v_bad_whys, v_with_ids, v_distinct, v_input_bad,
           v_ords, v_ids, v_given, v_types, v_data, v_meta
      FROM (SELECT t.ord, r.type #>> '{}' AS ty, r.data AS d, r.data::text AS dt,
                   CASE WHEN json_typeof(r.metadata) = 'object' THEN r.metadata END AS m,
                   CASE WHEN json_typeof(r.metadata) = 'object' THEN r.metadata::text END AS mt,
                   r.event_id #>> '{}' AS idt, coalesce(json_typeof(r.event_id) = 'string', false) AS given,
                   CASE
                WHEN json_typeof(t.e) <> 'object' THEN 'is not a JSON object'
                -- An element that is its four fields' texts, in the Go
                -- client's order and spelling, has no other key: the keys
                -- are listed (a set-returning function, run per element)
                -- only for one that is not.
                WHEN t.e::text IS DISTINCT FROM '{' || concat_ws(',', '"event_id":' || r.event_id::text,
                                                                 '"type":' || r.type::text, '"data":' || r.data::text,
                                                                 '"metadata":' || r.metadata::text) || '}'
                     AND EXISTS (SELECT 1 FROM json_object_keys(t.e) k
                                 WHERE k NOT IN ('type', 'data', 'metadata', 'event_id'))
                    THEN 'has a key other than "type", "data", "metadata" and "event_id"'
                WHEN json_typeof(r.type) IS DISTINCT FROM 'string' OR r.type #>> '{}' = ''
                    THEN 'needs "type", a non-empty string'
                WHEN coalesce(json_typeof(r.data), '') NOT IN ('object', 'array')
                    THEN 'needs "data", a JSON object or array'
                WHEN coalesce(json_typeof(r.metadata), 'null') NOT IN ('object', 'null')
                    THEN 'has "metadata" that is not a JSON object'
                WHEN coalesce(json_typeof(r.event_id), 'null') NOT IN ('string', 'null')
                     OR r.event_id #>> '{}' !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
                    THEN 'has "event_id" that is not a UUID'
               END AS why
              FROM json_array_elements(p_events) WITH ORDINALITY AS t(e, ord)
              LEFT JOIN LATERAL json_to_record(CASE WHEN json_typeof(t.e) = 'object' THEN t.e END)
                        AS r(type json, data json, metadata json, event_id json) ON true
            -- OFFSET 0 keeps the subquery a scan of its own, so that each
            -- row's columns are computed once (pulled up into the
            -- aggregate, "why" would be computed for every aggregate that
            -- reads it), and event_input_bad, given columns, is inlined
            -- (given an expression such as d::text, which its body reads
            -- several times, it would be called, and planned, per event).
            OFFSET 0) x;
    IF v_count = 0 THEN
        RAISE EXCEPTION 'annals: events must be a non-empty JSON array' USING ERRCODE = 'AN002';
    END IF;
    IF v_bad_ords IS NOT NULL THEN
        SELECT b.o, b.w INTO v_bad_ord, v_bad_why FROM unnest(v_bad_ords, v_bad_whys) AS b(o, w) ORDER BY b.o LIMIT 1;
        RAISE EXCEPTION 'annals: event % of % %', v_bad_ord, v_count, v_bad_why USING ERRCODE = 'AN002';
    END IF;

    IF v_with_ids > 1 AND v_with_ids <> v_distinct THEN
        RAISE EXCEPTION 'annals: the same event_id appears twice in one append' USING ERRCODE = 'AN002';
    END IF;

    -- The input limits, on the text as written (see the header).
    IF {{.Schema}}.stream_input_bad(p_stream_id, p_expected_version, v_count) OR v_input_bad THEN
        BEGIN
            PERFORM {{.Schema}}.append_batch_refuse(ARRAY[p_stream_id], ARRAY[p_expected_version],
                array_fill(1, ARRAY[v_count]), ARRAY(SELECT generate_series(1, v_count)),
                ARRAY(SELECT e.id FROM unnest(v_ords, v_ids) AS e(ord, id) ORDER BY e.ord),
                ARRAY(SELECT e.t FROM unnest(v_ords, v_types) AS e(ord, t) ORDER BY e.ord),
                ARRAY(SELECT e.d::text FROM unnest(v_ords, v_data) AS e(ord, d) ORDER BY e.ord),
                ARRAY(SELECT e.m::text FROM unnest(v_ords, v_meta) AS e(ord, m) ORDER BY e.ord));
        EXCEPTION WHEN SQLSTATE 'AN002' THEN
            GET STACKED DIAGNOSTICS v_msg = MESSAGE_TEXT, v_detail = PG_EXCEPTION_DETAIL;
        END;
        -- append_batch_refuse's message is "annals: append_batch: <field>
        -- <why>", its DETAIL names the event (0: the stream) and the append.
        v_detail := coalesce(v_detail, '{}');
        v_event := (v_detail::json ->> 'event')::int;
        v_msg := substr(coalesce(v_msg, 'annals: append_batch: input breaks the limits'), length('annals: append_batch: ') + 1);
        RAISE EXCEPTION '%', CASE WHEN v_event > 0 THEN format('annals: event %s of %s %s', v_event, v_count, v_msg)
                                  ELSE 'annals: ' || v_msg END
            USING ERRCODE = 'AN002', DETAIL = (v_detail::jsonb - 'append')::text;
    END IF;

    -- Serialize the numbering (append_events, 0001).
    PERFORM pg_advisory_xact_lock({{.AppendLockK1}}, {{.AppendLockK2}});

    -- Idempotency as in append_events: re-appending events that are all
    -- stored already (same IDs, stream, type and data) returns the stored
    -- positions and writes nothing.
    IF v_with_ids > 0 THEN
        v_step := pg_sequence_last_value({{.ArchiveStepSequence}});
        IF v_step IS NOT NULL AND NOT pg_visible_in_snapshot(v_step::text::xid8, pg_current_snapshot())
           AND {{.Schema}}.archive_step_unseen(v_step) THEN
            RAISE EXCEPTION 'annals: events were archived after this transaction''s snapshot was taken; retry the append'
                USING ERRCODE = 'serialization_failure';
        END IF;
        -- The same data: the same text, or, when the texts differ, the same
        -- jsonb, asked only of texts jsonb can hold.
        SELECT count(*),
               count(*) FILTER (WHERE ev.stream_id = p_stream_id AND ev.event_type = e.t
                                  AND CASE WHEN ev.data::text = e.d::text THEN true
                                           WHEN {{.Schema}}.jsonb_may_overflow(ev.data::text)
                                                OR {{.Schema}}.jsonb_may_overflow(e.d::text)
                                           THEN CASE WHEN {{.Schema}}.jsonb_storable(ev.data::text)
                                                          AND {{.Schema}}.jsonb_storable(e.d::text)
                                                     THEN ev.data::jsonb = e.d::jsonb ELSE false END
                                           ELSE ev.data::jsonb = e.d::jsonb END)
          INTO v_existing, v_matching
          FROM unnest(v_ids, v_given, v_types, v_data) AS e(id, g, t, d)
          JOIN {{.Schema}}.events_all ev ON ev.event_id = e.id
         WHERE e.g;
        IF v_existing > 0 THEN
            IF v_existing = v_count AND v_matching = v_count THEN
                RETURN QUERY
                    SELECT ev.event_id, ev.global_sequence, ev.stream_version
                      FROM unnest(v_ords, v_ids) AS e(ord, id)
                      JOIN {{.Schema}}.events_all ev ON ev.event_id = e.id
                     ORDER BY e.ord;
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
            RAISE EXCEPTION 'annals: stream % was created concurrently', quote_literal(p_stream_id)
                USING ERRCODE = 'serialization_failure';
        END IF;
    ELSE
        UPDATE {{.Schema}}.streams
           SET version = v_current + v_count, updated_at = v_now, state = 0
         WHERE stream_id = p_stream_id;
    END IF;

    v_first := nextval({{.EventsSequence}});
    IF v_count > 1 THEN
        PERFORM setval({{.EventsSequence}}, v_first + v_count - 1);
    END IF;

    RETURN QUERY
        INSERT INTO {{.Schema}}.events AS ev
               (global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at)
        SELECT v_first + e.ord - 1, e.id, p_stream_id, v_current + e.ord, e.t, e.d, e.m, v_now
          FROM unnest(v_ords, v_ids, v_types, v_data, v_meta) AS e(ord, id, t, d, m)
         ORDER BY e.ord
        RETURNING ev.event_id, ev.global_sequence, ev.stream_version;

    PERFORM pg_notify({{.Channel}}, (v_first + v_count - 1)::text);
END
$fn$;

REVOKE ALL ON FUNCTION {{.Schema}}.append_events_json(text, bigint, json) FROM PUBLIC;

-- Whoever may append through append_events may append through
-- append_events_json: an upgraded database keeps its roles able to append
-- in transactions from the Go client without running annals grant again.
DO $grants$
DECLARE
    v_schema constant text := {{.SchemaLiteral}};
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) AS who
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = pg_catalog.format('%I.append_events(text, bigint, jsonb)', v_schema)::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.append_events_json(text, bigint, json) TO %s',
                                  v_schema, r.who);
    END LOOP;
END
$grants$;

COMMENT ON FUNCTION {{.Schema}}.append_events_json(text, bigint, json) IS
    'annals: append_events taking json: stores each event''s data and metadata as written (append_events stores jsonb''s rendering). See docs/sql-api.md.';
