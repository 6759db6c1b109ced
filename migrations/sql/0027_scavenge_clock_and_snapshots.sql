-- annals schema: the scavenger's clock is the server's, and snapshots go
-- with the events they were built from.
--
-- scavenge(instance, now, batch) took the retention clock of a run from its
-- caller, unbounded: an operator who passed a time in the future (by hand,
-- or with scavenge.Config.Clock) removed events that their stream's maximum
-- age keeps, seconds after they were appended, and nothing in the log told
-- (found by an audit). A run's clock is now the earlier of the caller's
-- time and the server's clock_timestamp() when the run starts: a caller may
-- pass an earlier time (it removes less), never a later one. There is no
-- allowance for skew: a client whose clock is ahead gets the server's. The
-- run records that server time as started_at, so now_at <= started_at for
-- every run from this migration on (annals verify reports a run that
-- removed events with a clock ahead of its start).
--
-- A step also deleted events only: the snapshots of an aggregate whose
-- stream was hard-deleted (its decrypted state) stayed in snapshots after
-- every event of the stream was gone. Each step now deletes, for every
-- stream it removes events of, the snapshots built from removed events:
-- those at or below the highest version it removed, those whose state
-- folds the stream from a version at or below it (first_version, 0026;
-- from version 1 for a row older code wrote: a snapshot at version 10 of a
-- stream truncated before 6 folds the removed versions 1 to 5 when it was
-- written before the truncation), and every snapshot of a hard-deleted
-- stream. Snapshots are caches (0006): loads replay the stream without
-- them, and use none of these (their first version is not the stream's
-- first visible one). 0026 deleted those of events removed before.
--
-- A step deletes snapshots (by stream, in the order its plan finds them)
-- and records personal_streams rows; forget_subject deletes both, in its
-- own order, so the two could deadlock. A step now takes the advisory lock
-- <schema>:forget shared (waiting for it) before it deletes anything, and
-- forget_subject takes it exclusively: a Forget waits for the step in
-- progress, and a step for the Forget in progress (a Forget scans every
-- event with personal data). Snapshot writes take it shared too, without
-- waiting: steps and snapshot writes do not wait for each other.
--
-- Known window: a snapshot write whose statement read the stream before a
-- hard delete_stream committed, and commits after the step that removes
-- the stream's last events, stays (the step did not see it; no later step
-- removes events of that stream). The same write raced with a truncation
-- stays until the stream's next removal; loads use neither. forget_subject
-- still deletes such a row for the subjects of the stream's personal data
-- (the step recorded them in personal_streams), and docs/sql-api.md gives
-- the statement that deletes the snapshots of hard-deleted streams by
-- hand. Closing it would take SaveSnapshot locking the stream's row (FOR
-- SHARE, which delete_stream's update waits for), so that appends to the
-- stream would wait for its snapshot writes: not worth it for a window of
-- milliseconds that leaves a row no load uses.

-- scavenge as in 0023, plus: the run's clock is clamped to the server's,
-- the snapshots of removed events go with them, and a step holds the
-- forget lock shared.
CREATE OR REPLACE FUNCTION {{.Schema}}.scavenge(p_instance text, p_now timestamptz, p_batch int)
RETURNS TABLE (run_id bigint, started_by text, started_at timestamptz, now_at timestamptz,
               from_position bigint, scanned_to bigint, target_position bigint, removed bigint,
               steps int, done boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    r       record;
    v_to    bigint;
    v_n     bigint;
    v_na    bigint;
    v_min   bigint;
    v_clock timestamptz;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 THEN
        RAISE EXCEPTION 'annals: scavenge: batch must be at least 1' USING ERRCODE = 'AN002',
            DETAIL = '{"event": 0, "field": "batch"}';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended({{.SchemaLiteral}} || ':scavenge', 0));

    SELECT * INTO r FROM {{.Schema}}.scavenge_runs x WHERE x.finished_at IS NULL FOR UPDATE;
    IF NOT FOUND THEN
        v_clock := clock_timestamp();
        v_min := coalesce((SELECT min(a.global_sequence) FROM {{.Schema}}.events_archive a),
                          (SELECT min(e.global_sequence) FROM {{.Schema}}.events e));
        INSERT INTO {{.Schema}}.scavenge_runs AS x (started_by, instance, started_at, updated_at, now_at,
                                                   from_position, scanned_to, target_position)
        SELECT session_user, p_instance, v_clock, v_clock, least(coalesce(p_now, v_clock), v_clock),
               coalesce(v_min - 1, 0), coalesce(v_min - 1, 0),
               coalesce(max(e.global_sequence), (SELECT max(a.global_sequence) FROM {{.Schema}}.events_archive a), 0)
          FROM {{.Schema}}.events e
        RETURNING * INTO r;
    END IF;

    v_to := least(r.scanned_to + p_batch, r.target_position);
    UPDATE {{.Schema}}.scavenge_runs x SET step_xact = pg_current_xact_id() WHERE x.id = r.id;
    -- Shared with other steps and with snapshot writes; a Forget holds it
    -- exclusively (forget_subject, 0026: the same key).
    PERFORM pg_advisory_xact_lock_shared(hashtextextended({{.SchemaLiteral}} || ':forget', 0));
    WITH gone AS (
        DELETE FROM {{.Schema}}.events e
         USING {{.Schema}}.streams s
         WHERE e.global_sequence > r.scanned_to AND e.global_sequence <= v_to
           AND s.stream_id = e.stream_id
           AND (s.state = 2
                OR e.stream_version < s.truncate_before
                OR e.stream_version <= s.version - s.max_count
                OR e.recorded_at < r.now_at - s.max_age)
        RETURNING e.stream_id, e.stream_version, e.data, s.state
    ), linked AS (
        INSERT INTO {{.Schema}}.personal_streams (subject, stream_id)
        SELECT DISTINCT p.subject #>> '{}', g.stream_id
          FROM gone g
         CROSS JOIN LATERAL jsonb_path_query(g.data::jsonb, '$.*."$personal".subject') AS p(subject)
         WHERE strpos(g.data::text, '"$personal"') > 0 AND coalesce(p.subject #>> '{}', '') <> ''
        ON CONFLICT DO NOTHING
    ), snaps AS (
        DELETE FROM {{.Schema}}.snapshots sn
         USING (SELECT g.stream_id, max(g.stream_version) AS v, bool_or(g.state = 2) AS hard
                  FROM gone g GROUP BY g.stream_id) g
         WHERE sn.stream_id = g.stream_id
           AND (g.hard OR sn.stream_version <= g.v
                OR coalesce(CASE WHEN sn.checked_version = sn.stream_version THEN sn.first_version END, 1) <= g.v))
    SELECT count(*) INTO v_n FROM gone;
    WITH gone AS (
        DELETE FROM {{.Schema}}.events_archive e
         USING {{.Schema}}.streams s
         WHERE e.global_sequence > r.scanned_to AND e.global_sequence <= v_to
           AND s.stream_id = e.stream_id
           AND (s.state = 2
                OR e.stream_version < s.truncate_before
                OR e.stream_version <= s.version - s.max_count
                OR e.recorded_at < r.now_at - s.max_age)
        RETURNING e.stream_id, e.stream_version, e.data, s.state
    ), linked AS (
        INSERT INTO {{.Schema}}.personal_streams (subject, stream_id)
        SELECT DISTINCT p.subject #>> '{}', g.stream_id
          FROM gone g
         CROSS JOIN LATERAL jsonb_path_query(g.data::jsonb, '$.*."$personal".subject') AS p(subject)
         WHERE strpos(g.data::text, '"$personal"') > 0 AND coalesce(p.subject #>> '{}', '') <> ''
        ON CONFLICT DO NOTHING
    ), snaps AS (
        DELETE FROM {{.Schema}}.snapshots sn
         USING (SELECT g.stream_id, max(g.stream_version) AS v, bool_or(g.state = 2) AS hard
                  FROM gone g GROUP BY g.stream_id) g
         WHERE sn.stream_id = g.stream_id
           AND (g.hard OR sn.stream_version <= g.v
                OR coalesce(CASE WHEN sn.checked_version = sn.stream_version THEN sn.first_version END, 1) <= g.v))
    SELECT count(*) INTO v_na FROM gone;

    RETURN QUERY
    UPDATE {{.Schema}}.scavenge_runs x
       SET step_xact = NULL, scanned_to = v_to, removed = x.removed + v_n + v_na, steps = x.steps + 1,
           updated_at = clock_timestamp(),
           finished_at = CASE WHEN v_to >= x.target_position THEN clock_timestamp() END
     WHERE x.id = r.id
    RETURNING x.id, x.started_by, x.started_at, x.now_at, x.from_position, x.scanned_to, x.target_position,
              x.removed, x.steps, x.finished_at IS NOT NULL;
END
$fn$;

COMMENT ON FUNCTION {{.Schema}}.scavenge(text, timestamptz, int) IS
    'annals: one step of the scavenge run (removes expired, truncated and hard-deleted events in a batch of positions, and the snapshots built from them; records the run in scavenge_runs; the run''s clock is never later than the server''s). See docs/sql-api.md.';
