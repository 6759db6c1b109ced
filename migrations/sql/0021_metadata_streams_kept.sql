-- annals schema: metadata streams cannot be deleted.
--
-- set_stream_retention records every change of a stream's retention as a
-- "$stream.truncated" event in the stream's metadata stream "$$<stream_id>",
-- which projections read to learn that events may vanish. delete_stream
-- accepted those streams too: a soft delete made them unreadable while
-- set_stream_retention kept appending to them, and a hard delete left a
-- tombstone that set_stream_retention then wrote past, breaking the promise
-- that a hard-deleted stream takes no event again. A stream ID that starts
-- with "$$" is now refused (AN002, field stream_id); deleting the stream a
-- metadata stream describes is unchanged. Otherwise the function is 0012's.

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
