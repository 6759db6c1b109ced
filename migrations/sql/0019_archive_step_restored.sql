-- annals schema: an archive step's transaction ID that this cluster never
-- assigned is an old step, not a new one.
--
-- Appends with caller-chosen IDs check that the latest archive step (the
-- transaction ID it stored in archive_step_xact, 0015) is visible to their
-- snapshot, and refuse with serialization_failure when it is not: a REPEATABLE
-- READ append whose snapshot predates a step cannot see the events it moved.
-- But a dump restored into another cluster (pg_dump writes the sequence's
-- value with setval) brings that cluster a transaction ID from the old one's
-- counter, usually far ahead of the new one's: no snapshot saw it, and every
-- append with caller-chosen IDs failed with serialization_failure until the
-- new cluster had assigned that many transaction IDs. Found by review; see
-- migrations/TestArchiveStepFromAnotherCluster.
--
-- archive_step_unseen keeps the check and tells the two apart: a step ID the
-- snapshot does not see is a step to wait for only if this cluster has
-- assigned it; one it has not (pg_xact_status refuses an ID in the future)
-- came with a dump, and its step is long finished. append_events and
-- append_one are redefined here to call it when their snapshot does not see
-- the ID, the rare case, so the common one costs what it did (otherwise as in
-- 0015 and 0018); append_batch calls it from 0020.

-- archive_step_unseen reports whether the archive step that stored p_step
-- (NULL: none ever ran) is one this transaction's snapshot cannot see. The
-- exception block (a subtransaction) runs only when the snapshot does not see
-- the ID, which a READ COMMITTED append holding the append lock never meets.
CREATE FUNCTION {{.Schema}}.archive_step_unseen(p_step bigint)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF p_step IS NULL OR pg_visible_in_snapshot(p_step::text::xid8, pg_current_snapshot()) THEN
        RETURN false;
    END IF;
    BEGIN
        PERFORM pg_xact_status(p_step::text::xid8);
    EXCEPTION WHEN invalid_parameter_value THEN
        -- "transaction ID ... is in the future": not assigned here.
        RETURN false;
    END;
    RETURN true;
END
$fn$;

REVOKE ALL ON FUNCTION {{.Schema}}.archive_step_unseen(bigint) FROM PUBLIC;

-- append_events as in 0015, its archive step check through
-- archive_step_unseen.
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
    v_step     bigint;
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
        -- Event IDs are looked up in both tables (events_all). The lookup
        -- runs under the append lock, which archive steps hold too: it sees
        -- every step that committed, unless this transaction's snapshot is
        -- older than the latest step (REPEATABLE READ, SERIALIZABLE).
        v_step := pg_sequence_last_value({{.ArchiveStepSequence}});
        IF v_step IS NOT NULL AND NOT pg_visible_in_snapshot(v_step::text::xid8, pg_current_snapshot())
           AND {{.Schema}}.archive_step_unseen(v_step) THEN
            RAISE EXCEPTION 'annals: events were archived after this transaction''s snapshot was taken; retry the append'
                USING ERRCODE = 'serialization_failure';
        END IF;
        SELECT count(*),
               count(*) FILTER (WHERE ev.stream_id = p_stream_id
                                  AND ev.event_type = t.e->>'type'
                                  AND ev.data::jsonb = t.e->'data')
          INTO v_existing, v_matching
          FROM jsonb_array_elements(p_events) AS t(e)
          JOIN {{.Schema}}.events_all ev ON ev.event_id = (t.e->>'event_id')::uuid
         WHERE jsonb_typeof(t.e->'event_id') = 'string';
        IF v_existing > 0 THEN
            IF v_existing = v_count AND v_matching = v_count THEN
                RETURN QUERY
                    SELECT ev.event_id, ev.global_sequence, ev.stream_version
                      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS t(e, ord)
                      JOIN {{.Schema}}.events_all ev ON ev.event_id = (t.e->>'event_id')::uuid
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


-- append_one as in 0018, its archive step check through archive_step_unseen.
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
