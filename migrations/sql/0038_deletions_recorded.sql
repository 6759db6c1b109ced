-- annals schema: every deletion is recorded where the scavenger cannot
-- remove it, and retention records do not depend on the session.
--
-- delete_stream marked a stream deleted (streams.state, truncate_before) and
-- appended "$stream.deleted" to the stream itself, where the scavenger
-- removes it with the stream's other events. After that, streams.state was
-- the only trace of a deletion, and annals verify could not tell a deletion
-- from a row changed by the schema's owner: a hard-deleted stream set back
-- to deleted (then recreated by an append, although a tombstone refuses
-- appends forever), a live stream's oldest events removed with
-- truncate_before set to pass as a deletion scavenged long ago, a deleted
-- stream's version lowered so that an append reuses its versions.
--
-- delete_stream now also appends a "$stream.truncated" record to the
-- stream's metadata stream "$$<stream_id>" (which the scavenger never
-- empties since 0024), as set_stream_retention does, in the same
-- transaction: the settings after the deletion (stream_id, truncate_before,
-- max_age_seconds, max_count), plus "deleted" ("soft" or "hard") and
-- "version" (the version of its "$stream.deleted" event). It is the same
-- reserved type, so only annals' functions can write it (the append
-- functions refuse "$stream." types), and a projection that reacts to
-- "$stream.truncated" learns that the stream's events up to the deletion
-- will go. The metadata stream's ID may be 514 bytes ("$$" and a stream ID
-- of up to 512): it is not checked against the 512-byte limit of stream
-- IDs, or a stream with a long ID could no longer be deleted.
--
-- deletions_recorded_after() returns the head of the log when this
-- migration ran (under the append lock): every deletion at or below it is
-- without a record. A few just above it may be too: a delete_stream call
-- that started before this transaction committed runs the function as it
-- was (PL/pgSQL takes the body when the call starts), waits for this
-- transaction at the append lock and commits after it, without a record.
-- Such calls were queued on the lock before any call that started after
-- the commit, so their deletion events lie below the first deletion record
-- (but for a call that had started and not yet asked for the lock when
-- this transaction committed). annals verify checks the deletions below
-- the first record (at or below this head while there is none) as before.
--
-- set_stream_retention wrote max_age_seconds as float8, whose text follows
-- the session's extra_float_digits: with 0 (PostgreSQL 11's default, set by
-- some drivers and roles) an age with a microsecond part was recorded
-- rounded to 15 digits, and verify reported the retention as set outside
-- the function. Both functions now write it as numeric (exact, trailing
-- zeros trimmed), whatever the session. Otherwise set_stream_retention is
-- 0032's and delete_stream 0021's.

DO $mark$
DECLARE
    v_head bigint;
BEGIN
    -- A deletion in progress holds the lock: it lands at or below the head.
    -- One whose call starts after this commits runs the new function; one
    -- that started before and waits here runs the old one, without a
    -- record, just above the head (see above).
    PERFORM pg_advisory_xact_lock({{.AppendLockK1}}, {{.AppendLockK2}});
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END INTO v_head FROM {{.Schema}}.events_global_sequence s;
    EXECUTE pg_catalog.format(
        'CREATE FUNCTION %I.deletions_recorded_after() RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN %s',
        {{.SchemaLiteral}}, v_head);
END
$mark$;

COMMENT ON FUNCTION {{.Schema}}.deletions_recorded_after() IS
    'annals: the head of the log when delete_stream began recording deletions in "$$<stream>" (migration 0038); annals verify checks deletions at or below it as before.';

CREATE OR REPLACE FUNCTION {{.Schema}}.delete_stream(p_stream_id text, p_expected_version bigint, p_hard boolean,
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
    v_meta    text := '$$' || p_stream_id;
    v_mver    bigint;
    v_mseq    bigint;
    s         record;
BEGIN
    IF p_hard IS NULL THEN
        RAISE EXCEPTION 'annals: delete_stream: hard must be true or false' USING ERRCODE = 'AN002',
            DETAIL = '{"event": 0, "field": "hard"}';
    END IF;
    IF starts_with(p_stream_id, '$$') THEN
        RAISE EXCEPTION 'annals: delete_stream: % is a metadata stream, kept by annals (set_stream_retention appends to it); delete the stream it describes instead',
            quote_literal(p_stream_id) USING ERRCODE = 'AN002',
            DETAIL = '{"event": 0, "field": "stream_id"}';
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
    UPDATE {{.Schema}}.streams x
       SET version = v_current + 1, updated_at = v_now,
           state = CASE WHEN p_hard THEN 2 ELSE 1 END,
           truncate_before = greatest(x.truncate_before, v_current + 2)
     WHERE x.stream_id = p_stream_id
    RETURNING x.truncate_before, x.max_age, x.max_count INTO s;

    v_seq := nextval({{.EventsSequence}});
    INSERT INTO {{.Schema}}.events
           (global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at)
    VALUES (v_seq, v_id, p_stream_id, v_current + 1, '$stream.deleted',
            CASE WHEN p_hard THEN '{"hard":true}' ELSE '{"hard":false}' END::json, p_metadata::json, v_now);

    -- The record, after the deletion event (positions are commit order
    -- within the transaction too).
    INSERT INTO {{.Schema}}.streams AS x (stream_id, version, created_at, updated_at)
    VALUES (v_meta, 1, v_now, v_now)
    ON CONFLICT (stream_id) DO UPDATE SET version = x.version + 1, updated_at = v_now
    RETURNING x.version INTO v_mver;
    v_mseq := nextval({{.EventsSequence}});
    INSERT INTO {{.Schema}}.events
           (global_sequence, event_id, stream_id, stream_version, event_type, data, recorded_at)
    VALUES (v_mseq, gen_random_uuid(), v_meta, v_mver, '$stream.truncated',
            json_build_object('stream_id', p_stream_id, 'truncate_before', s.truncate_before,
                              'max_age_seconds', trim_scale(extract(epoch FROM s.max_age)), 'max_count', s.max_count,
                              'deleted', CASE WHEN p_hard THEN 'hard' ELSE 'soft' END, 'version', v_current + 1),
            v_now);

    PERFORM pg_notify({{.Channel}}, v_mseq::text);
    RETURN QUERY SELECT v_id, v_seq, v_current + 1;
END
$fn$;

COMMENT ON FUNCTION {{.Schema}}.delete_stream(text, bigint, boolean, jsonb) IS
    'annals: delete a stream (soft or hard): appends "$stream.deleted" to it and records the deletion as "$stream.truncated" in "$$<stream>". See docs/sql-api.md.';

CREATE OR REPLACE FUNCTION {{.Schema}}.set_stream_retention(p_stream_id text, p_max_age interval, p_max_count bigint,
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
    v_age  interval;
BEGIN
    IF p_max_age < interval '0' OR extract(epoch FROM p_max_age) < 0 OR p_max_count < 0 OR p_truncate_before < 0 THEN
        RAISE EXCEPTION 'annals: set_stream_retention: max_age, max_count and truncate_before must not be negative'
            USING ERRCODE = 'AN002', DETAIL = '{"event": 0, "field": "retention"}';
    END IF;
    IF extract(epoch FROM p_max_age) > 9214819200 THEN
        RAISE EXCEPTION 'annals: set_stream_retention: max_age % is over 292 years (9214819200 seconds)', p_max_age
            USING ERRCODE = 'AN002',
                  DETAIL = json_build_object('event', 0, 'field', 'max_age', 'limit', 9214819200,
                                             'actual', extract(epoch FROM p_max_age))::text;
    END IF;
    v_age := {{.Schema}}.max_age_fixed(p_max_age);
    IF starts_with(p_stream_id, '$$') THEN
        RAISE EXCEPTION 'annals: set_stream_retention: % is a metadata stream, kept by annals (it records the retention of the stream it describes); set the retention of that stream instead',
            quote_literal(p_stream_id) USING ERRCODE = 'AN002',
            DETAIL = '{"event": 0, "field": "stream_id"}';
    END IF;
    PERFORM {{.Schema}}.check_event_input(v_meta, NULL,
        jsonb_build_array(jsonb_build_object('type', '$stream.truncated', 'data', '{}'::jsonb)));
    -- Wait for a scavenge step in progress: it decided with the settings
    -- that were committed when it started.
    PERFORM pg_advisory_xact_lock_shared(hashtextextended({{.SchemaLiteral}} || ':scavenge', 0));
    PERFORM pg_advisory_xact_lock({{.AppendLockK1}}, {{.AppendLockK2}});

    UPDATE {{.Schema}}.streams x
       SET max_age = CASE WHEN v_age IS NULL THEN x.max_age WHEN v_age = interval '0' THEN NULL ELSE v_age END,
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
                              'max_age_seconds', trim_scale(extract(epoch FROM s.max_age)), 'max_count', s.max_count),
            v_now);
    PERFORM pg_notify({{.Channel}}, v_seq::text);
    RETURN QUERY SELECT s.version, s.state, s.truncate_before, s.max_age, s.max_count, v_id, v_seq;
END
$fn$;

COMMENT ON FUNCTION {{.Schema}}.set_stream_retention(text, interval, bigint, bigint) IS
    'annals: set a stream''s max age (at most 292 years, stored as a fixed length), max count and truncate-before; appends "$stream.truncated" to "$$<stream>". See docs/sql-api.md.';
