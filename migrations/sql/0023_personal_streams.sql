-- annals schema: forget_subject reaches the snapshots of streams whose
-- personal events were scavenged.
--
-- forget_subject found the streams to delete snapshots of by scanning the
-- events (and the archive) for the subject's personal data. Once scavenge
-- had removed those events (retention by count or age, a hard delete), the
-- link was gone, and an aggregate's snapshot kept the subject's personal
-- data in clear after Forget (guarantees.md §16 says no byte of it remains
-- in snapshots). scavenge now records, for every event it removes that
-- carries personal data, the (subject, stream) pair in personal_streams,
-- and forget_subject deletes the snapshots of those streams too, then the
-- subject's pairs. Only the functions (running as the schema's owner) read
-- or write the table.

CREATE TABLE {{.Schema}}.personal_streams (
    subject   text NOT NULL CHECK (subject <> ''),
    stream_id text NOT NULL,
    PRIMARY KEY (subject, stream_id)
);

COMMENT ON TABLE {{.Schema}}.personal_streams IS
    'annals: streams whose scavenged events carried a subject''s personal data; forget_subject deletes their snapshots.';

-- scavenge as in 0015, plus: the (subject, stream) pairs of the personal
-- data in the events it removes are kept in personal_streams.
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
    r     record;
    v_to  bigint;
    v_n   bigint;
    v_na  bigint;
    v_min bigint;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 THEN
        RAISE EXCEPTION 'annals: scavenge: batch must be at least 1' USING ERRCODE = 'AN002',
            DETAIL = '{"event": 0, "field": "batch"}';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended({{.SchemaLiteral}} || ':scavenge', 0));

    SELECT * INTO r FROM {{.Schema}}.scavenge_runs x WHERE x.finished_at IS NULL FOR UPDATE;
    IF NOT FOUND THEN
        v_min := coalesce((SELECT min(a.global_sequence) FROM {{.Schema}}.events_archive a),
                          (SELECT min(e.global_sequence) FROM {{.Schema}}.events e));
        INSERT INTO {{.Schema}}.scavenge_runs AS x (started_by, instance, now_at, from_position, scanned_to, target_position)
        SELECT session_user, p_instance, coalesce(p_now, clock_timestamp()),
               coalesce(v_min - 1, 0), coalesce(v_min - 1, 0),
               coalesce(max(e.global_sequence), (SELECT max(a.global_sequence) FROM {{.Schema}}.events_archive a), 0)
          FROM {{.Schema}}.events e
        RETURNING * INTO r;
    END IF;

    v_to := least(r.scanned_to + p_batch, r.target_position);
    UPDATE {{.Schema}}.scavenge_runs x SET step_xact = pg_current_xact_id() WHERE x.id = r.id;
    WITH gone AS (
        DELETE FROM {{.Schema}}.events e
         USING {{.Schema}}.streams s
         WHERE e.global_sequence > r.scanned_to AND e.global_sequence <= v_to
           AND s.stream_id = e.stream_id
           AND (s.state = 2
                OR e.stream_version < s.truncate_before
                OR e.stream_version <= s.version - s.max_count
                OR e.recorded_at < r.now_at - s.max_age)
        RETURNING e.stream_id, e.data
    ), linked AS (
        INSERT INTO {{.Schema}}.personal_streams (subject, stream_id)
        SELECT DISTINCT p.subject #>> '{}', g.stream_id
          FROM gone g
         CROSS JOIN LATERAL jsonb_path_query(g.data::jsonb, '$.*."$personal".subject') AS p(subject)
         WHERE strpos(g.data::text, '"$personal"') > 0 AND coalesce(p.subject #>> '{}', '') <> ''
        ON CONFLICT DO NOTHING)
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
        RETURNING e.stream_id, e.data
    ), linked AS (
        INSERT INTO {{.Schema}}.personal_streams (subject, stream_id)
        SELECT DISTINCT p.subject #>> '{}', g.stream_id
          FROM gone g
         CROSS JOIN LATERAL jsonb_path_query(g.data::jsonb, '$.*."$personal".subject') AS p(subject)
         WHERE strpos(g.data::text, '"$personal"') > 0 AND coalesce(p.subject #>> '{}', '') <> ''
        ON CONFLICT DO NOTHING)
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

-- forget_subject as in 0015, plus: the snapshots of the streams in
-- personal_streams go too, and the subject's rows there with them.
CREATE OR REPLACE FUNCTION {{.Schema}}.forget_subject(p_subject text)
RETURNS TABLE (had_key boolean, snapshots_deleted bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_had  boolean;
    v_snap bigint;
BEGIN
    IF p_subject IS NULL OR p_subject = '' THEN
        RAISE EXCEPTION 'annals: subject must not be empty' USING ERRCODE = 'AN002';
    END IF;
    SELECT k.wrapped_key IS NOT NULL INTO v_had
      FROM {{.Schema}}.personal_keys k WHERE k.subject = p_subject FOR UPDATE;
    IF NOT FOUND THEN
        v_had := false;
        INSERT INTO {{.Schema}}.personal_keys (subject, wrapped_key, forgotten_at)
        VALUES (p_subject, NULL, clock_timestamp())
        ON CONFLICT (subject) DO UPDATE SET wrapped_key = NULL,
            forgotten_at = coalesce({{.Schema}}.personal_keys.forgotten_at, clock_timestamp());
    ELSIF v_had THEN
        UPDATE {{.Schema}}.personal_keys SET wrapped_key = NULL, forgotten_at = clock_timestamp()
         WHERE subject = p_subject;
    END IF;
    WITH s AS (
        SELECT e.stream_id
          FROM {{.Schema}}.events_all e
         WHERE strpos(e.data::text, '"$personal"') > 0
           AND jsonb_path_exists(e.data::jsonb, '$.*."$personal" ? (@.subject == $s)',
                                 jsonb_build_object('s', p_subject))
        UNION
        SELECT ps.stream_id FROM {{.Schema}}.personal_streams ps WHERE ps.subject = p_subject
    ), d AS (
        DELETE FROM {{.Schema}}.snapshots sn USING s WHERE sn.stream_id = s.stream_id RETURNING 1
    ), l AS (
        DELETE FROM {{.Schema}}.personal_streams ps WHERE ps.subject = p_subject
    )
    SELECT count(*) INTO v_snap FROM d;
    RETURN QUERY SELECT v_had, v_snap;
END
$fn$;

