-- annals schema: set_stream_retention takes every stream ID an append takes.
--
-- It checked its metadata stream's ID ("$$" and the stream ID) against the
-- 512-byte limit of stream IDs, so a stream whose ID is 511 or 512 bytes,
-- which appends accept, could take no retention: AN002 "stream_id is 514
-- bytes; the limit is 512", naming a length the caller never sent.
-- delete_stream had the same limit lifted in 0038 (a metadata stream's ID
-- may be 514 bytes). Now the function checks the stream ID it is given, as
-- delete_stream does; everything else is 0040's.
--
-- The signature, owner and grants are kept (CREATE OR REPLACE).

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
    o      record;
    r      jsonb;
    v_meta text := '$$' || p_stream_id;
    v_mver bigint;
    v_seq  bigint;
    v_id   uuid := gen_random_uuid();
    v_now  timestamptz;
    v_age  interval;
    v_tb   bigint;
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
    PERFORM {{.Schema}}.check_event_input(p_stream_id, NULL,
        jsonb_build_array(jsonb_build_object('type', '$stream.truncated', 'data', '{}'::jsonb)));
    -- Wait for a scavenge step in progress: it decided with the settings
    -- that were committed when it started.
    PERFORM pg_advisory_xact_lock_shared(hashtextextended({{.SchemaLiteral}} || ':scavenge', 0));
    PERFORM pg_advisory_xact_lock({{.AppendLockK1}}, {{.AppendLockK2}});

    SELECT x.version, x.state, x.truncate_before, x.max_age, x.max_count INTO o
      FROM {{.Schema}}.streams x
     WHERE x.stream_id = p_stream_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'annals: stream % does not exist', quote_literal(p_stream_id)
            USING ERRCODE = 'AN001',
                  DETAIL = json_build_object('stream_id', p_stream_id, 'expected_version', -1, 'actual_version', 0)::text;
    END IF;
    v_tb := o.truncate_before;
    IF p_truncate_before IS NOT NULL THEN
        IF greatest(least(p_truncate_before, o.version + 1), 1) < greatest(o.truncate_before, 1) THEN
            RAISE EXCEPTION 'annals: set_stream_retention: truncate_before % is below stream %''s current %; it can only grow',
                p_truncate_before, quote_literal(p_stream_id), o.truncate_before
                USING ERRCODE = 'AN002',
                      DETAIL = json_build_object('event', 0, 'field', 'truncate_before', 'limit', o.truncate_before,
                                                 'actual', p_truncate_before)::text;
        END IF;
        IF greatest(least(p_truncate_before, o.version + 1), 1) > greatest(o.truncate_before, 1) THEN
            v_tb := least(p_truncate_before, o.version + 1);
        END IF;
    END IF;

    UPDATE {{.Schema}}.streams x
       SET max_age = CASE WHEN v_age IS NULL THEN x.max_age WHEN v_age = interval '0' THEN NULL ELSE v_age END,
           max_count = CASE WHEN p_max_count IS NULL THEN x.max_count WHEN p_max_count = 0 THEN NULL ELSE p_max_count END,
           truncate_before = v_tb
     WHERE x.stream_id = p_stream_id
    RETURNING x.version, x.state, x.truncate_before, x.max_age, x.max_count INTO s;

    IF s.truncate_before = o.truncate_before AND s.max_count IS NOT DISTINCT FROM o.max_count
       AND s.max_age IS NOT DISTINCT FROM o.max_age THEN
        -- Nothing changed: no record, if the latest one (or, without
        -- one, the absence of any retention) says so already.
        SELECT e.data INTO r
          FROM {{.Schema}}.events_all e
         WHERE e.stream_id = v_meta AND e.event_type = '$stream.truncated'
         ORDER BY e.stream_version DESC
         LIMIT 1;
        IF (r IS NULL AND s.truncate_before <= 1 AND s.max_count IS NULL AND s.max_age IS NULL)
           OR ((r->>'truncate_before')::bigint = s.truncate_before
               AND (r->>'max_count')::bigint IS NOT DISTINCT FROM s.max_count
               AND (r->>'max_age_seconds')::numeric IS NOT DISTINCT FROM extract(epoch FROM s.max_age)) THEN
            RETURN QUERY SELECT s.version, s.state, s.truncate_before, s.max_age, s.max_count, NULL::uuid, 0::bigint;
            RETURN;
        END IF;
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
    'annals: set a stream''s max age (at most 292 years, stored as a fixed length), max count and truncate-before (which can only grow: a lower one fails with AN002); appends "$stream.truncated" to "$$<stream>" unless nothing changed (then event_id NULL, global_sequence 0). See docs/sql-api.md.';
