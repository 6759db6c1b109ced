-- annals schema: append_batch with less fixed cost per call.
--
-- A call's fixed cost, not its per-append cost, is what a lone append pays
-- (docs/benchmarks.md, "CPU per event": about 360 µs per call plus 23-28
-- per append). Three parts of it are cut here, with the same rules and the
-- same outcomes:
--
-- - each append's stream and expected version are checked inside the
--   per-event aggregate, at the append's first event (the order rule gives
--   every append exactly one event numbered 1), instead of in an EXISTS
--   sub-query of their own;
-- - the distinctness of event IDs and of streams is checked only when the
--   call has more than one event: compared pairwise in plain expressions
--   for up to 16 events, sorted and counted for more (the two count(DISTINCT)
--   sorts cost a lone append 20-30 µs);
-- - the idempotency probe of a one-event call looks its ID up directly,
--   without the grouping the general probe needs; a call of more events
--   first asks whether any of its IDs is stored at all (one index scan per
--   table with = ANY), and groups per append only if one is.
--
-- Backend CPU per call (pgbench, 1 client, fsync on, caller-chosen IDs):
-- one append of one event 390-405 -> 338-355 µs; groups of 4 and 16
-- single-event appends about 10-20 µs less.

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
    -- step after this one), in one statement: the input limits of
    -- check_event_input (stream IDs of 1..512 and types of 1..256 bytes with
    -- no control character and not only white space, metadata keys of at
    -- most 256 bytes and reserved keys of the right type, at most 64 MiB of
    -- data and metadata per event, nothing jsonb cannot hold); expected
    -- versions valid; events listed append by append (1, 2, ... n) and numbered 1, 2, ...
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
                            OR NOT {{.Schema}}.metadata_ok(e.m::jsonb)))
                   -- Each append's stream and expected version, at its first
                   -- event (the order rule above gives every append exactly
                   -- one event numbered 1).
                   OR (e.i = 1
                       AND (p_streams[e.a] IS NULL
                            OR coalesce(p_expected[e.a] < -1 OR p_expected[e.a] > 9223372036854775807 - v_events, false)
                            OR NOT (octet_length(p_streams[e.a]) <= 512 AND p_streams[e.a] ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$'))))
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

    -- Idempotency: an append whose events are all stored (same IDs, stream,
    -- type and data) is answered with the stored positions (status 3); one
    -- that is partly stored, or stored with other content, fails (status 2).
    -- This is looked up before the lock, to keep the lock short: the log is
    -- append-only, so what is found stored now is still stored under the
    -- lock. An event stored in between by a concurrent append of the same
    -- ID makes the INSERT below fail on the event_id key, which aborts the
    -- whole call; the Go client then sends each append alone through
    -- append_events, which decides under the lock.
    -- The lookup is made twice when an archive step (which moves events
    -- from events to events_archive while holding the append lock) ran
    -- between it and the lock: the latest step's transaction ID is read
    -- before the lookup and again under the lock (see 0015's header).
    IF p_check_ids THEN
        v_step0 := pg_sequence_last_value({{.ArchiveStepSequence}});
    END IF;
    LOOP
        IF p_check_ids AND v_events = 1 THEN
            -- One event: one index probe, without the grouping below.
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
            -- Some ID is stored (the test above looks the IDs up as one
            -- index scan of each table; when none is, as in a first
            -- append, the work below is skipped). One index probe per event
            -- (LATERAL on the unique event_id), so the plan cannot turn into
            -- a scan of the log.
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
        -- Serialize the numbering (the same lock as append_events) before the
        -- streams are read: what the statements below read is then current, and
        -- positions become visible in commit order.
        PERFORM pg_advisory_xact_lock({{.AppendLockK1}}, {{.AppendLockK2}});
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
