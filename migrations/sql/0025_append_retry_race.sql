-- annals schema: a retry racing its original answers as a retry, when the
-- stream refuses it.
--
-- append_one, and append_batch in calls of fewer than 64 events with
-- check_ids, look caller-chosen event IDs up before they take the ordering
-- lock, and (unless an archive step ran meanwhile) not again: a look-up
-- under the lock would cost every append with caller-chosen IDs its
-- index probes there, where every appender waits. So a retry that waits
-- for the lock while its original (the same IDs, an append whose outcome
-- its caller did not learn) holds it and commits did not see the stored
-- events, and failed as no retry should:
--
-- - with an expected version the original made wrong (NoStream, Exact(n)):
--   status 1, wrong expected version (or 4/5 had the stream been deleted);
-- - with one it still holds (Any, StreamExists): unique_violation (23505)
--   on the events' event_id at the INSERT.
--
-- Now a call whose stream refuses an append (status 1, 4 or 5, decided
-- under the lock) looks the IDs up again, under the lock, before it
-- answers, as 0020 did for its large calls that had not looked them up at
-- all: a stored append answers 3 (its positions) or 2, whatever its stream
-- says. A written append costs what it did (the change is on the refusal
-- path only; append_batch's test gains two conditions that the common case
-- skips at its first, v_failed).
--
-- The unique violation stays: catching it needs an exception block, a
-- subtransaction on every call. The caller calls again: the second call's
-- look-up before the lock sees the stored events and answers 3 or 2
-- (docs/sql-api.md; the Go client re-sends such an append once, through
-- append_events). Otherwise append_one is 0019's and append_batch 0020's.

-- append_one as in 0019; a refused append looks its ID up again.
CREATE OR REPLACE FUNCTION {{.Schema}}.append_one(
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
    -- ran in between, as in append_batch (0015, 0017), or if the stream
    -- refuses the append (below).
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
        IF v_step IS NOT NULL AND NOT pg_visible_in_snapshot(v_step::text::xid8, pg_current_snapshot())
           AND {{.Schema}}.archive_step_unseen(v_step) THEN
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
            IF status <> 2 AND p_check_id THEN
                -- Refused by its stream. A retry of an append that
                -- committed while this call waited for the lock (its
                -- look-up above ran before) answers 3 or 2 whatever its
                -- stream says now: look the ID up again, under the lock.
                -- Only a refused call pays for it.
                SELECT count(*)::int, count(*) FILTER (WHERE x.stream_id = p_stream AND x.event_type = p_type
                                                         AND x.data::jsonb = p_data::jsonb)::int,
                       max(x.global_sequence), max(x.stream_version)
                  INTO v_existing, v_matching, v_stored_pos, v_stored_version
                  FROM {{.Schema}}.events_all x WHERE x.event_id = p_id;
                IF v_existing = 1 AND v_matching = 1 THEN
                    status := 3;
                    global_sequence := v_stored_pos;
                    stream_version := v_stored_version;
                    RETURN;
                ELSIF v_existing > 0 THEN
                    status := 2;
                END IF;
            END IF;
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

-- append_batch as in 0020; a refused append looks the IDs up again (once),
-- under the lock, whether or not they were looked up before it.
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
    -- Set (no default: NULL, which costs nothing to initialise) once the
    -- IDs were looked up under the lock, after a refusal by a stream.
    v_rechecked boolean;
    -- Whether this call's IDs are looked up only if the INSERT finds one of
    -- them stored (see the header).
    v_optimistic boolean := false;
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

    -- Idempotency (see the header, 0017 and 0015's header): looked up
    -- before the lock if events were ever archived; otherwise only if the
    -- INSERT below finds an ID stored, or an append is refused.
    IF p_check_ids THEN
        v_step0 := pg_sequence_last_value({{.ArchiveStepSequence}});
        -- Not looking up pays off for calls of many events only: looking
        -- up costs about 3 µs per event before the lock, not looking up a
        -- subtransaction and one more statement under it (docs/benchmarks.md,
        -- "Caller-chosen IDs in large appends"). No archive step ever ran
        -- (an archive step sets the sequence before it moves a row), and
        -- the archive is empty (rows restored into it some other way, e.g.
        -- by logical replication, set no sequence).
        IF v_step0 IS NULL AND v_events >= 64 THEN
            -- A statement of its own, run only here: an expression with a
            -- sub-select is not a PL/pgSQL simple expression, and would
            -- start an executor for every call (measured: 4 writers of
            -- single events lost 5-12%).
            v_optimistic := NOT EXISTS (SELECT 1 FROM {{.Schema}}.events_archive);
        END IF;
    END IF;
    <<attempt>>
    LOOP
    LOOP
        IF p_check_ids AND NOT v_optimistic AND v_events = 1 THEN
            SELECT count(*)::int, count(*) FILTER (WHERE x.stream_id = p_streams[1] AND x.event_type = p_types[1]
                                                     AND x.data::jsonb = p_data[1]::jsonb)::int
              INTO v_existing1, v_matching1
              FROM {{.Schema}}.events_all x WHERE x.event_id = p_ids[1];
            IF v_existing1 > 0 THEN
                v_status[1] := CASE WHEN v_existing1 = 1 AND v_matching1 = 1 THEN 3 ELSE 2 END;
                v_failed := true;
            END IF;
        ELSIF p_check_ids AND NOT v_optimistic
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
        IF v_step IS NOT NULL AND NOT pg_visible_in_snapshot(v_step::text::xid8, pg_current_snapshot())
           AND {{.Schema}}.archive_step_unseen(v_step) THEN
            RAISE EXCEPTION 'annals: events were archived after this transaction''s snapshot was taken; retry the append'
                USING ERRCODE = 'serialization_failure';
        END IF;
        EXIT WHEN v_step IS NOT DISTINCT FROM v_step0;
        -- An archive step ran in between: look the IDs up, under the lock.
        v_status := array_fill(0::smallint, ARRAY[v_appends]);
        v_failed := false;
        v_optimistic := false;
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
    IF v_failed AND p_check_ids AND v_rechecked IS NULL
       AND (v_optimistic OR 1 = ANY (v_status) OR 4 = ANY (v_status) OR 5 = ANY (v_status)) THEN
        -- A refused append may be the retry of one stored already, which
        -- answers 3 (or 2) whatever its stream says now: look the IDs up
        -- (again, if they were looked up before the lock: its original
        -- may have committed while this call waited for it), under the
        -- lock. Only a call with a refused append pays for it.
        v_status := array_fill(0::smallint, ARRAY[v_appends]);
        v_failed := false;
        v_optimistic := false;
        v_rechecked := true;
        CONTINUE attempt;
    END IF;

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
    IF v_optimistic THEN
        -- The writes, undone together if the INSERT finds an event ID
        -- stored already (the events' unique index is the look-up); the
        -- call then looks the IDs up and starts again. The positions drawn
        -- stay unused. Any unique violation restarts it: the constraint's
        -- name is not a safe test (another unique index on event_id, e.g.
        -- one an interrupted REINDEX CONCURRENTLY left, may report it), and
        -- a violation that is not a stored ID recurs in the second attempt,
        -- which raises it.
        BEGIN
            INSERT INTO {{.Schema}}.streams AS s (stream_id, version, created_at, updated_at)
            SELECT a.id, v_current[a.n] + v_count[a.n], v_now, v_now
              FROM unnest(p_streams) WITH ORDINALITY AS a(id, n)
             WHERE v_status[a.n] = 0
            ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at, state = 0;
            v_first := nextval({{.EventsSequence}});
            v_void := setval({{.EventsSequence}}, v_first + v_events - 1);
            INSERT INTO {{.Schema}}.events (global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at)
            SELECT v_first + e.ord - 1, e.id, p_streams[e.a], v_current[e.a] + e.i, e.t, e.d, nullif(e.m, '')::json, v_now
              FROM unnest(p_append, p_index, p_ids, p_types, v_data, p_metadata) WITH ORDINALITY AS e(a, i, id, t, d, m, ord)
             WHERE v_status[e.a] = 0;
        EXCEPTION WHEN unique_violation THEN
            v_status := array_fill(0::smallint, ARRAY[v_appends]);
            v_failed := false;
            v_optimistic := false;
            v_rechecked := true;
            CONTINUE attempt;
        END;
        -- The written events' rows, from what was inserted (not RETURNING:
        -- rows returned inside the block would stay in the result were it
        -- undone).
        RETURN QUERY
            SELECT p_streams[e.a], 0::smallint, e.id, v_first + e.ord - 1, v_current[e.a] + e.i, NULL::bigint
              FROM unnest(p_append, p_index, p_ids) WITH ORDINALITY AS e(a, i, id, ord)
             WHERE v_status[e.a] = 0;
    ELSE
        -- As in 0018.
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
    END IF;
    EXIT attempt;
    END LOOP attempt;

    v_void := pg_notify({{.Channel}}, (v_first + v_events - 1)::text);
END
$fn$;
