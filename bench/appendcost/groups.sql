-- A prototype for groups of single-event appends (docs/benchmarks.md,
-- "Ninth 2026-11-30 session: a leaner function for groups of single-event
-- appends"), not annals' code: append_batch's work for a call in which
-- every append has one event, with the input rules as PL/pgSQL simple
-- expressions in a loop (no statement), the positions and versions as OUT
-- arrays (no result rows), and only the happy path (any refusal raises).
-- Same statements otherwise: the ID probe, the lock, the streams read and
-- upsert, one INSERT (under a lock key of its own). Needs the annals schema migrated in the same
-- database; run by groups.sh.
DROP SCHEMA IF EXISTS appendcost_groups CASCADE;
CREATE SCHEMA appendcost_groups;
CREATE OR REPLACE FUNCTION appendcost_groups.lean(
    p_streams text[], p_expected bigint[], p_ids uuid[], p_types text[], p_data text[], p_metadata text[], p_check_ids boolean,
    OUT status smallint[], OUT global_sequence bigint, OUT versions bigint[])
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
DECLARE
    n int := cardinality(p_streams);
    i int;
    v_bad boolean := false;
    v_void text;
    v_cur bigint[];
    v_state smallint[];
    v_now timestamptz;
    v_first bigint;
BEGIN
    FOR i IN 1 .. n LOOP
        v_bad := v_bad OR p_ids[i] IS NULL OR annals.event_input_bad(p_types[i], p_data[i], p_metadata[i]) IS NOT FALSE
                 OR annals.stream_input_bad(p_streams[i], p_expected[i], 1)
                 OR (i > 1 AND (p_ids[i] = ANY (p_ids[1:i - 1]) OR p_streams[i] = ANY (p_streams[1:i - 1])));
    END LOOP;
    IF v_bad THEN RAISE EXCEPTION 'bad'; END IF;
    IF p_check_ids AND (EXISTS (SELECT 1 FROM annals.events x WHERE x.event_id = ANY (p_ids))
                   OR EXISTS (SELECT 1 FROM annals.events_archive x WHERE x.event_id = ANY (p_ids))) THEN
        RAISE EXCEPTION 'stored';
    END IF;
    v_void := pg_advisory_xact_lock(1, 2);
    SELECT array_agg(coalesce(s.version, 0) ORDER BY a.n), array_agg(coalesce(s.state, 0::smallint) ORDER BY a.n)
      INTO v_cur, v_state
      FROM unnest(p_streams) WITH ORDINALITY AS a(id, n)
      LEFT JOIN annals.streams s ON s.stream_id = a.id;
    status := array_fill(0::smallint, ARRAY[n]);
    FOR i IN 1 .. n LOOP
        IF v_state[i] <> 0 OR (p_expected[i] >= 0 AND p_expected[i] <> v_cur[i]) THEN
            RAISE EXCEPTION 'mismatch';
        END IF;
    END LOOP;
    v_now := clock_timestamp();
    INSERT INTO annals.streams AS s (stream_id, version, created_at, updated_at)
    SELECT a.id, v_cur[a.n] + 1, v_now, v_now FROM unnest(p_streams) WITH ORDINALITY AS a(id, n)
    ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at, state = 0;
    v_first := nextval('annals.events_global_sequence');
    v_void := setval('annals.events_global_sequence', v_first + n - 1);
    INSERT INTO annals.events (global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at)
    SELECT v_first + e.ord - 1, e.id, e.s, v_cur[e.ord] + 1, e.t, e.d::json, nullif(e.m, '')::json, v_now
      FROM unnest(p_ids, p_streams, p_types, p_data, p_metadata) WITH ORDINALITY AS e(id, s, t, d, m, ord);
    global_sequence := v_first;
    versions := v_cur;
    v_void := pg_notify('annals_x', (v_first + n - 1)::text);
END
$fn$;
