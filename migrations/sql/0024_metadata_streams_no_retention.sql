-- annals schema: metadata streams take no retention.
--
-- set_stream_retention records every change of a stream's retention as a
-- "$stream.truncated" event in the stream's metadata stream "$$<stream_id>";
-- annals verify checks a stream's max_count and max_age against the latest
-- of those records. set_stream_retention accepted metadata streams too, so
-- any writer could give "$$<stream_id>" a retention of its own and let the
-- scavenger remove the records (verify then had nothing to check the
-- stream's retention against, and did not check it; found by an audit). A
-- stream ID that starts with "$$" is now refused (AN002, field stream_id),
-- as delete_stream has refused them since 0021: metadata streams are kept
-- whole. Retention set on them before this migration stays (annals verify
-- notes the streams whose records it can no longer find). Otherwise the
-- function is 0012's.

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
BEGIN
    IF p_max_age < interval '0' OR p_max_count < 0 OR p_truncate_before < 0 THEN
        RAISE EXCEPTION 'annals: set_stream_retention: max_age, max_count and truncate_before must not be negative'
            USING ERRCODE = 'AN002', DETAIL = '{"event": 0, "field": "retention"}';
    END IF;
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
