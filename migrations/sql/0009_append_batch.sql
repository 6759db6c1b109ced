-- annals schema: append_batch, the group-commit append.
--
-- append_batch appends several independent appends (each to its own stream,
-- with its own expected version) in the caller's transaction, under one
-- acquisition of the log's ordering lock, and reports an outcome per append
-- instead of raising: one append's wrong expected version or event-ID
-- conflict does not abort the others. The Go client coalesces concurrent
-- Store.Append calls of a process into one call of this function, sent as one
-- statement (its own transaction): one round trip, one commit, one WAL flush
-- for the whole group.
--
-- Arguments (1-based; all arrays of one call describe one group):
--   p_streams    text[]   the stream of each append; no stream twice
--   p_expected   bigint[] each append's expected version, as in append_events
--                         (NULL any, 0 no stream, -1 stream exists, N >= 1)
--   p_append     int[]    per event: the index of its append in p_streams;
--                         events are listed append by append, in order
--   p_index      int[]    per event: its index within its append (1, 2, ...)
--   p_ids        uuid[]   per event: its ID; no ID twice
--   p_types      text[]   per event: its type
--   p_data       text[]   per event: its data, a JSON object or array (stored
--                         byte for byte as given)
--   p_metadata   text[]   per event: its metadata, a JSON object, or NULL/''
--   p_check_ids  boolean  whether some IDs came from the caller and may be
--                         stored already (idempotent re-appends); a client
--                         that generated every ID itself passes false and
--                         saves the look-up
--
-- Positions are drawn for every event of the group; those of failed appends
-- are left unused (holes, as a rolled-back append leaves).
--
-- Returns one row per event of each append that was written or found stored
-- (status 0 written, 3 already stored: an idempotent re-append), and one row
-- per failed append (status 1 wrong expected version, with actual_version;
-- status 2 some of its event IDs are stored with other content, or only some
-- are stored). stream_id says which append a row belongs to.
-- metadata_ok reports whether an event's metadata object keeps the rules of
-- check_event_input: keys of at most 256 bytes; correlation_id,
-- causation_id, traceparent and tracestate strings; schema_version a
-- positive int4.
CREATE FUNCTION {{.Schema}}.metadata_ok(p_md jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN jsonb_typeof(p_md) = 'object'
   AND coalesce(jsonb_typeof(p_md->'correlation_id'), 'string') = 'string'
   AND coalesce(jsonb_typeof(p_md->'causation_id'), 'string') = 'string'
   AND coalesce(jsonb_typeof(p_md->'traceparent'), 'string') = 'string'
   AND coalesce(jsonb_typeof(p_md->'tracestate'), 'string') = 'string'
   AND CASE WHEN p_md->'schema_version' IS NULL THEN true
            WHEN jsonb_typeof(p_md->'schema_version') = 'number'
            THEN (p_md->>'schema_version')::numeric BETWEEN 1 AND 2147483647
                 AND (p_md->>'schema_version')::numeric = trunc((p_md->>'schema_version')::numeric)
            ELSE false END
   AND (pg_column_size(p_md) <= 256
        OR NOT EXISTS (SELECT 1 FROM jsonb_object_keys(p_md) k WHERE octet_length(k) > 256));

-- jsonb_storable reports whether a JSON text can be stored as jsonb (no
-- \u0000, no unpaired surrogate): what the Go client and append_events
-- enforce. append_batch asks only for texts that hold a \u escape.
CREATE FUNCTION {{.Schema}}.jsonb_storable(p_json text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM p_json::jsonb;
    RETURN true;
EXCEPTION WHEN invalid_text_representation OR untranslatable_character OR invalid_parameter_value THEN
    RETURN false;
END
$fn$;

-- append_batch_refuse raises AN002 for the first rule of append_batch that
-- its arguments break, with a DETAIL that names it as check_event_input
-- does: {"event": n (1-based over all events of the call; 0 for an
-- append's stream or expected version), "append": n, "field": ..., "limit",
-- "actual"}. append_batch calls it only after its one-statement check
-- found a problem, so the common case never pays for the diagnosis.
CREATE FUNCTION {{.Schema}}.append_batch_refuse(
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

REVOKE ALL ON FUNCTION {{.Schema}}.append_batch_refuse(text[], bigint[], int[], int[], uuid[], text[], text[], text[]) FROM PUBLIC;

CREATE FUNCTION {{.Schema}}.append_batch(
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

    SELECT array_agg(coalesce((SELECT s.version FROM {{.Schema}}.streams s WHERE s.stream_id = a.id), 0) ORDER BY a.n)
      INTO v_current
      FROM unnest(p_streams) WITH ORDINALITY AS a(id, n);

    -- Expected versions (status 1 when one does not hold).
    FOR i IN 1 .. v_appends LOOP
        IF v_status[i] = 0
           AND ((p_expected[i] = -1 AND v_current[i] = 0)
                OR (p_expected[i] >= 0 AND p_expected[i] <> v_current[i])) THEN
            v_status[i] := 1;
            v_failed := true;
        END IF;
    END LOOP;

    IF v_failed THEN
        RETURN QUERY
            SELECT p_streams[g.n], v_status[g.n], NULL::uuid, NULL::bigint, NULL::bigint, v_current[g.n]
              FROM generate_series(1, v_appends) AS g(n)
             WHERE v_status[g.n] IN (1, 2);
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
    ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at;

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

REVOKE ALL ON FUNCTION {{.Schema}}.append_batch(text[], bigint[], int[], int[], uuid[], text[], text[], text[], boolean) FROM PUBLIC;

-- Whoever may append through append_events may append through append_batch:
-- an upgraded database keeps its roles able to append from the Go client
-- (whose Store.Append calls append_batch) without running annals grant again.
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
        EXECUTE pg_catalog.format(
            'GRANT EXECUTE ON FUNCTION %I.append_batch(text[], bigint[], int[], int[], uuid[], text[], text[], text[], boolean) TO %s',
            v_schema, r.who);
    END LOOP;
END
$grants$;

COMMENT ON FUNCTION {{.Schema}}.append_batch(text[], bigint[], int[], int[], uuid[], text[], text[], text[], boolean) IS
    'annals: several appends to distinct streams under one ordering lock, with an outcome per append (group commit). See docs/sql-api.md.';
