-- annals schema: archiving. Old events leave the hot events table for
-- events_archive, a table with the same columns and the same unique keys
-- (global_sequence, event_id, (stream_id, stream_version)), so that the hot
-- table and its indexes stay small while every read can still reach the
-- whole log.
--
-- The archive holds a contiguous prefix of the log: archive(instance,
-- before, batch) moves the events with positions below a target (at most
-- before - 1, and never the newest event, so the head stays in the hot
-- table) in position order, one batch of positions per call and per
-- transaction: DELETE ... RETURNING from events feeding an INSERT into
-- events_archive, one statement, so any snapshot sees each event in exactly
-- one of the tables. Only positions below an event visible when the run
-- started are moved: every lower position is committed by then (positions
-- are commit order), so nothing in flight is ever archived. Each run is
-- recorded in archive_runs (who, when, range, rows, steps) and is resumable:
-- an interrupted run is continued by the next call. The archive horizon is
-- the last archived_to of the runs, plus one: every position below it is in
-- events_archive (or was scavenged), every position at or above it is in
-- events.
--
-- Reads that may reach archived positions read the view events_all
-- (events_archive UNION ALL events; PostgreSQL merges the two index scans
-- in position or stream-version order). The catch-up engine's hot read
-- stays on events alone and reads the archive only when its cursor is
-- below the newest archived position (see catchup/queries.sql).
--
-- Idempotency by event ID: append_events and append_batch look event IDs
-- up in both tables. An archive step holds the append lock while it moves
-- events (appends wait for a step, which is short: --batch positions), and
-- records its transaction ID in the sequence archive_step_xact, which is
-- not transactional: an append whose look-up ran before the step (the
-- look-up append_batch makes before taking the append lock) looks again
-- under the lock; one whose snapshot predates a step it cannot see
-- (REPEATABLE READ or SERIALIZABLE transactions older than the step) fails
-- with serialization_failure, to be retried. Without this, an event moved
-- between the look-up and the INSERT could be stored twice.
--
-- Lifecycle: scavenge() removes rows from both tables; archive steps and
-- scavenge steps take the same lock, so they never overlap.

CREATE TABLE {{.Schema}}.events_archive (
    global_sequence bigint      NOT NULL PRIMARY KEY,
    event_id        uuid        NOT NULL UNIQUE,
    stream_id       text        NOT NULL,
    stream_version  bigint      NOT NULL CHECK (stream_version > 0),
    event_type      text        NOT NULL CHECK (event_type <> ''),
    data            json        NOT NULL,
    metadata        json,
    recorded_at     timestamptz NOT NULL,
    UNIQUE (stream_id, stream_version)
);

COMMENT ON TABLE {{.Schema}}.events_archive IS
    'annals: archived events (a prefix of the log moved out of events by archive()). Same columns and keys as events; written only by archive(), rows removed only by scavenge().';

-- The whole log: archived events, then the hot ones. Read through it
-- whatever may reach positions below the archive horizon.
CREATE VIEW {{.Schema}}.events_all AS
    SELECT global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at
      FROM {{.Schema}}.events_archive
    UNION ALL
    SELECT global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at
      FROM {{.Schema}}.events;

COMMENT ON VIEW {{.Schema}}.events_all IS
    'annals: the whole log, archived and hot events (events_archive UNION ALL events).';

-- One row per archive run: who started it, when, the range of positions it
-- moves, how far it got and how many events it moved.
CREATE TABLE {{.Schema}}.archive_runs (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_by      text        NOT NULL,
    instance        text,
    started_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at     timestamptz,
    requested_before bigint     NOT NULL,
    from_position   bigint      NOT NULL,
    archived_to     bigint      NOT NULL,
    target_position bigint      NOT NULL,
    moved           bigint      NOT NULL DEFAULT 0,
    steps           int         NOT NULL DEFAULT 0,
    -- the transaction of the step in progress: the triggers of events and
    -- events_archive let exactly that transaction move rows
    step_xact       xid8
);

CREATE UNIQUE INDEX archive_runs_one_open ON {{.Schema}}.archive_runs ((true)) WHERE finished_at IS NULL;
CREATE INDEX archive_runs_step ON {{.Schema}}.archive_runs (step_xact) WHERE step_xact IS NOT NULL;

COMMENT ON TABLE {{.Schema}}.archive_runs IS
    'annals: every archive run: who, when, the positions moved to events_archive and how many. Written only by archive().';

-- The transaction ID of the latest archive step (see above). Appends read it
-- with pg_sequence_last_value, which sees it at once, whatever their snapshot.
CREATE SEQUENCE {{.Schema}}.archive_step_xact AS bigint MINVALUE 0;

-- The append-only trigger of events, as in 0012, plus: the DELETE of an
-- archive step, recognised by its transaction ID in archive_runs.
CREATE OR REPLACE FUNCTION {{.Schema}}.events_append_only() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF TG_OP = 'DELETE'
       AND (EXISTS (SELECT 1 FROM {{.Schema}}.scavenge_runs r
                     WHERE r.step_xact = pg_current_xact_id() AND r.finished_at IS NULL)
            OR EXISTS (SELECT 1 FROM {{.Schema}}.archive_runs r
                        WHERE r.step_xact = pg_current_xact_id() AND r.finished_at IS NULL)) THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'annals: the events table is append-only; % is not allowed', TG_OP
        USING ERRCODE = 'AN004',
              HINT = 'Events are facts: append a compensating event instead (or delete a stream with delete_stream and let scavenge() remove it).';
END
$fn$;

-- events_archive: rows come in only through an archive step and leave only
-- through a scavenge step; UPDATE and TRUNCATE are refused, whoever runs them.
CREATE FUNCTION {{.Schema}}.events_archive_guard() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF (TG_OP = 'INSERT'
        AND EXISTS (SELECT 1 FROM {{.Schema}}.archive_runs r
                     WHERE r.step_xact = pg_current_xact_id() AND r.finished_at IS NULL))
       OR (TG_OP = 'DELETE'
           AND EXISTS (SELECT 1 FROM {{.Schema}}.scavenge_runs r
                        WHERE r.step_xact = pg_current_xact_id() AND r.finished_at IS NULL)) THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'annals: the events_archive table is written only by archive() and scavenge(); % is not allowed', TG_OP
        USING ERRCODE = 'AN004',
              HINT = 'Archive events with archive() (annals archive --before POSITION).';
END
$fn$;
REVOKE ALL ON FUNCTION {{.Schema}}.events_archive_guard() FROM PUBLIC;

CREATE TRIGGER events_archive_guard
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {{.Schema}}.events_archive
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Schema}}.events_archive_guard();

-- archive advances the open archive run by one batch of p_batch positions,
-- starting a run if none is open: from the archive horizon to p_before - 1,
-- but below the newest event (which stays in events, so the head is always
-- there). The open run, if any, keeps its own target (p_before is then only
-- recorded by the run that started). Returns the run's progress; done when
-- the run finished with this batch. Call it as a statement of its own, in a
-- loop, until done. The step holds the append lock until it commits (appends
-- wait for it) and the scavenge lock (scavenge steps and retention changes
-- wait for it).
CREATE FUNCTION {{.Schema}}.archive(p_instance text, p_before bigint, p_batch int)
RETURNS TABLE (run_id bigint, started_by text, started_at timestamptz, requested_before bigint,
               from_position bigint, archived_to bigint, target_position bigint, moved bigint,
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
    v_hor bigint;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 THEN
        RAISE EXCEPTION 'annals: archive: batch must be at least 1' USING ERRCODE = 'AN002',
            DETAIL = '{"event": 0, "field": "batch"}';
    END IF;
    IF p_before IS NULL OR p_before < 1 THEN
        RAISE EXCEPTION 'annals: archive: before must be a position of at least 1' USING ERRCODE = 'AN002',
            DETAIL = '{"event": 0, "field": "before"}';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended({{.SchemaLiteral}} || ':scavenge', 0));

    SELECT * INTO r FROM {{.Schema}}.archive_runs x WHERE x.finished_at IS NULL FOR UPDATE;
    IF NOT FOUND THEN
        SELECT coalesce(max(x.archived_to), 0) INTO v_hor FROM {{.Schema}}.archive_runs x;
        INSERT INTO {{.Schema}}.archive_runs AS x
               (started_by, instance, requested_before, from_position, archived_to, target_position)
        SELECT session_user, p_instance, p_before, v_hor, v_hor,
               greatest(v_hor, least(p_before - 1, coalesce(max(e.global_sequence) - 1, 0)))
          FROM {{.Schema}}.events e
        RETURNING * INTO r;
    END IF;

    v_to := least(r.archived_to + p_batch, r.target_position);
    IF v_to > r.archived_to THEN
        -- Appends wait while events move (see the header).
        PERFORM pg_advisory_xact_lock({{.AppendLockK1}}, {{.AppendLockK2}});
        PERFORM setval({{.ArchiveStepSequence}}, pg_current_xact_id()::text::bigint);
        UPDATE {{.Schema}}.archive_runs x SET step_xact = pg_current_xact_id() WHERE x.id = r.id;
        WITH moved AS (
            DELETE FROM {{.Schema}}.events e
             WHERE e.global_sequence > r.archived_to AND e.global_sequence <= v_to
            RETURNING e.global_sequence, e.event_id, e.stream_id, e.stream_version, e.event_type,
                      e.data, e.metadata, e.recorded_at)
        INSERT INTO {{.Schema}}.events_archive
               (global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at)
        SELECT m.global_sequence, m.event_id, m.stream_id, m.stream_version, m.event_type, m.data, m.metadata, m.recorded_at
          FROM moved m
         ORDER BY m.global_sequence;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    ELSE
        v_n := 0;
    END IF;

    RETURN QUERY
    UPDATE {{.Schema}}.archive_runs x
       SET step_xact = NULL, archived_to = v_to, moved = x.moved + v_n, steps = x.steps + 1,
           updated_at = clock_timestamp(),
           finished_at = CASE WHEN v_to >= x.target_position THEN clock_timestamp() END
     WHERE x.id = r.id
    RETURNING x.id, x.started_by, x.started_at, x.requested_before, x.from_position, x.archived_to,
              x.target_position, x.moved, x.steps, x.finished_at IS NOT NULL;
END
$fn$;

REVOKE ALL ON FUNCTION {{.Schema}}.archive(text, bigint, int) FROM PUBLIC;

COMMENT ON FUNCTION {{.Schema}}.archive(text, bigint, int) IS
    'annals: one step of the archive run (moves a batch of the oldest positions from events to events_archive; records the run in archive_runs). See docs/sql-api.md.';

-- scavenge as in 0012, plus: a run starts at the oldest position of either
-- table, and each step removes the expired events of its batch of positions
-- from events_archive too.
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
    DELETE FROM {{.Schema}}.events e
     USING {{.Schema}}.streams s
     WHERE e.global_sequence > r.scanned_to AND e.global_sequence <= v_to
       AND s.stream_id = e.stream_id
       AND (s.state = 2
            OR e.stream_version < s.truncate_before
            OR e.stream_version <= s.version - s.max_count
            OR e.recorded_at < r.now_at - s.max_age);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    DELETE FROM {{.Schema}}.events_archive e
     USING {{.Schema}}.streams s
     WHERE e.global_sequence > r.scanned_to AND e.global_sequence <= v_to
       AND s.stream_id = e.stream_id
       AND (s.state = 2
            OR e.stream_version < s.truncate_before
            OR e.stream_version <= s.version - s.max_count
            OR e.recorded_at < r.now_at - s.max_age);
    GET DIAGNOSTICS v_na = ROW_COUNT;

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

-- forget_subject as in 0014, reading the archived events too.
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
        SELECT DISTINCT e.stream_id
          FROM {{.Schema}}.events_all e
         WHERE strpos(e.data::text, '"$personal"') > 0
           AND jsonb_path_exists(e.data::jsonb, '$.*."$personal" ? (@.subject == $s)',
                                 jsonb_build_object('s', p_subject))
    ), d AS (
        DELETE FROM {{.Schema}}.snapshots sn USING s WHERE sn.stream_id = s.stream_id RETURNING 1
    )
    SELECT count(*) INTO v_snap FROM d;
    RETURN QUERY SELECT v_had, v_snap;
END
$fn$;

-- append_events as in 0012, plus: event IDs are looked up in the archive
-- too (an archived event re-appended is answered like a hot one).
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
        IF v_step IS NOT NULL AND NOT pg_visible_in_snapshot(v_step::text::xid8, pg_current_snapshot()) THEN
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


-- append_batch as in 0012, plus: event IDs are looked up in the archive too,
-- and looked up again under the lock when an archive step ran meanwhile.
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
    -- Everything else the arguments must satisfy, in one statement: the
    -- input limits of check_event_input (stream IDs of 1..512 and types of
    -- 1..256 bytes with no control character and not only white space,
    -- metadata keys of at most 256 bytes and reserved keys of the right
    -- type, at most 64 MiB of data and metadata per event, nothing jsonb
    -- cannot hold); streams and event IDs distinct; expected versions valid;
    -- events listed append by append (1, 2, ... n) and numbered 1, 2, ...
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
                            OR NOT {{.Schema}}.metadata_ok(e.m::jsonb))))
           OR max(e.a) <> v_appends
           OR count(DISTINCT e.id) <> v_events
           OR EXISTS (SELECT 1 FROM unnest(p_streams, p_expected) AS a(s, x)
                       WHERE a.s IS NULL OR a.x < -1 OR a.x > 9223372036854775807 - v_events
                          OR NOT (octet_length(a.s) <= 512 AND a.s ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$'))
           OR (SELECT count(DISTINCT a.s) FROM unnest(p_streams) AS a(s)) <> v_appends,
           array_agg(e.i ORDER BY e.ord) FILTER (WHERE e.ord = v_events OR p_append[e.ord + 1] <> e.a)
      INTO v_bad, v_count
      FROM unnest(p_append, p_index, p_ids, p_types, p_data, p_metadata) WITH ORDINALITY AS e(a, i, id, t, d, m, ord);
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
        IF p_check_ids THEN
            -- One index probe per event (LATERAL on the unique event_id), so
            -- the plan cannot turn into a scan of the log.
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


-- Upgraded databases keep their roles as capable as annals grant makes new
-- ones: whoever may read the log may read the archive; whoever may scavenge
-- (operators) may archive.
DO $grants$
DECLARE
    v_schema constant text := {{.SchemaLiteral}};
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) AS who
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
         WHERE c.oid = pg_catalog.format('%I.events', v_schema)::pg_catalog.regclass
           AND a.privilege_type = 'SELECT' AND a.grantee <> 0 AND a.grantee <> c.relowner
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON %I.events_archive, %I.events_all TO %s', v_schema, v_schema, r.who);
    END LOOP;
    FOR r IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) AS who
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = pg_catalog.format('%I.scavenge(text, timestamptz, int)', v_schema)::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.archive(text, bigint, int) TO %s', v_schema, r.who);
        EXECUTE pg_catalog.format('GRANT SELECT ON %I.archive_runs TO %s', v_schema, r.who);
    END LOOP;
END
$grants$;
