-- annals schema: what a writer appends or sets cannot stop Forgets and
-- scavenging for everyone.
--
-- An audit found three ways for a role granted `annals grant writer` to
-- break maintenance for every user of the schema, each recoverable only by
-- the schema's owner editing rows by hand:
--
-- 1. JSON that json accepts and jsonb refuses: a number beyond numeric's
--    range ('{"n": 1e1000000}'). append_one and append_batch check data as
--    json and ask jsonb (jsonb_storable) only for a text holding a \u
--    escape, so such an event was stored. forget_subject (0031) and the
--    scavenger (0027) cast events with personal data to jsonb, and then
--    failed with 22003 for every subject, and at every step over that
--    position. Now:
--    - jsonb_storable also answers false for numeric_value_out_of_range
--      and program_limit_exceeded, the errors jsonb's input adds to
--      json's (besides the \u ones it already caught, and
--      character_not_in_repertoire, which a \u escape can raise in a
--      database that is not UTF-8);
--    - event_input_bad asks jsonb_storable also when
--      jsonb_may_overflow says a number could be out of range: one
--      regular expression over the data (a number with an exponent of 5
--      digits or more) and its length (over 6384 bytes). numeric refuses
--      a value with more than 16383 digits after the point or 131072
--      before it, counting the exponent: with at most 4 exponent digits
--      (9999) that takes over 6384 fraction digits, or over 121073 integer
--      ones, so a shorter text without such an exponent always fits. The
--      expression stays inlined (migrations/TestInputRulesInlined); it
--      costs an append about 1 µs for a payload of 200 bytes, and a
--      payload over 6384 bytes a jsonb parse;
--    - metadata needs nothing new: event_input_bad casts it to jsonb
--      (metadata_ok) before anything is written, so such a number fails
--      the append with 22003 and is never stored. append_events takes its
--      events as jsonb, which refuses it before the function runs;
--    - forget_subject and scavenge read events already stored through a
--      guarded cast: a row whose data jsonb cannot hold is never cast.
--      forget_subject counts it as holding every subject's personal data
--      when its text holds "$personal" (it deletes the snapshots of its
--      stream at every Forget: snapshots are caches, and a row it cannot
--      read could hold any subject's envelope next to the bad number), and
--      a scavenge step that removes such a row deletes every snapshot of
--      its stream, since it cannot record the row's subjects in
--      personal_streams.
--
-- 2. An over-long subject. An event appended through SQL may name a
--    subject of any length in a "$personal" envelope; when the scavenger
--    removed it, the (subject, stream) pair went into personal_streams,
--    whose primary key (a btree) holds at most 2704 bytes: every step
--    failed there ("index row size exceeds btree version 4 maximum"), for
--    good. personal_keys holds subjects of at most 1024 bytes (its CHECK;
--    the Go client refuses longer ones), so no key, and no decrypted
--    snapshot, can exist for a longer one: the scavenger records only
--    subjects of at most 1024 bytes, and forget_subject refuses a longer
--    subject (AN002, field subject) instead of failing on personal_keys'
--    CHECK.
--
-- 3. An unbounded maximum age. set_stream_retention refused only negative
--    ages: with interval '100000 years' every scavenge step over the
--    stream's events failed (now_at - max_age: timestamp out of range), and
--    so did StreamInfo (`annals stream info`: the age in microseconds is
--    beyond bigint) and reads of the stream. max_age is now at most 292
--    years (9214819200 seconds, years of 365.25 days as extract(epoch)
--    counts them; the longest Go time.Duration is 292.47 years, and the Go
--    client reads the age as one), refused beyond with AN002 (field
--    max_age), and stored as a fixed length: its extract(epoch) as hours,
--    minutes and seconds. Months and days were subtracted as calendar
--    units (a month of 28 to 31 days, a day of 23 to 25 hours in the
--    session's time zone), while annals verify, StreamInfo and the
--    "$stream.truncated" record ("max_age_seconds") count a month as 30
--    days and a day as 24 hours; the Go client sends seconds only. Stored
--    ages are converted here the same way, so no expression that reads
--    them (scavenge, ReadStream, StreamInfo) needs a guard: an age within
--    292 years keeps its length in seconds, and with it the record annals
--    verify compares it with; a longer one (only the SQL API could set it)
--    becomes 292 years, and one whose length is not positive (months and
--    days of opposite signs) becomes no limit. annals verify then reports
--    a shortened age (and a dropped one, on a stream with a max_count) as
--    retention set outside set_stream_retention, until the stream's
--    retention is set again. Only the functions, which run as the owner,
--    write streams.
--
-- The functions are copied from their latest versions (append_batch_refuse
-- 0012, forget_subject 0031, scavenge 0027, set_stream_retention 0024) with
-- only the changes above.

-- jsonb_storable reports whether a JSON text can be stored as jsonb: no
-- \u0000, no unpaired surrogate, no number beyond numeric's range. The
-- append functions ask it only for texts that event_input_bad finds at risk.
CREATE OR REPLACE FUNCTION {{.Schema}}.jsonb_storable(p_json text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM p_json::jsonb;
    RETURN true;
EXCEPTION WHEN invalid_text_representation OR untranslatable_character OR invalid_parameter_value
               OR character_not_in_repertoire OR numeric_value_out_of_range OR program_limit_exceeded THEN
    RETURN false;
END
$fn$;

-- jsonb_may_overflow reports whether a JSON text may hold a number that
-- numeric (and so jsonb) cannot: a number with an exponent of 5 digits or
-- more (after a ':', '[' or ',' and JSON white space: a string holding
-- "3e12345" does not count), or a text over 6384 bytes (see the header).
-- false means jsonb can hold every number of the text. One expression, so
-- that event_input_bad, which calls it, is still inlined.
CREATE FUNCTION {{.Schema}}.jsonb_may_overflow(p_json text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN octet_length(p_json) > 6384
    OR p_json ~ E'[:,[][ \\t\\r\\n]*-?[0-9]+(\\.[0-9]+)?[eE][+-]?[0-9]{5}';

-- event_input_bad as in 0018, with jsonb_storable asked also for data that
-- may hold a number out of range.
CREATE OR REPLACE FUNCTION {{.Schema}}.event_input_bad(p_type text, p_data text, p_metadata text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_type IS NULL OR p_data IS NULL
    OR starts_with(p_type, '$stream.')
    OR NOT (octet_length(p_type) <= 256
            AND p_type ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$')
    OR left(ltrim(p_data, E' \t\r\n'), 1) NOT IN ('{', '[')
    OR octet_length(p_data) + coalesce(octet_length(p_metadata), 0) > 67108864
    OR ((strpos(p_data, E'\\u') > 0 OR {{.Schema}}.jsonb_may_overflow(p_data))
        AND NOT {{.Schema}}.jsonb_storable(p_data))
    OR (p_metadata IS NOT NULL AND p_metadata <> ''
        AND (left(ltrim(p_metadata, E' \t\r\n'), 1) <> '{'
             OR (strpos(p_metadata, E'\\u') > 0 AND NOT {{.Schema}}.jsonb_storable(p_metadata))
             OR NOT {{.Schema}}.metadata_ok(p_metadata::jsonb)));

-- append_batch_refuse as in 0012; the reason given for data jsonb cannot
-- hold names numbers too.
CREATE OR REPLACE FUNCTION {{.Schema}}.append_batch_refuse(
    p_streams text[], p_expected bigint[], p_append int[], p_index int[], p_ids uuid[],
    p_types text[], p_data text[], p_metadata text[])
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_appends int := cardinality(p_streams);
    v_events  int := cardinality(p_ids);
    v_name    constant text := E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$';
    v_field   text;
    v_why     text;
    v_limit   bigint;
    v_size    bigint;
    v_at      int := 0;
    v_append  int;
    i         int;
BEGIN
    FOR i IN 1 .. v_appends LOOP
        v_append := i;
        IF octet_length(p_streams[i]) > 512 THEN
            v_field := 'stream_id'; v_limit := 512; v_size := octet_length(p_streams[i]);
            v_why := format('is %s bytes; the limit is 512', v_size);
        ELSIF p_streams[i] IS NULL OR p_streams[i] !~ v_name THEN
            v_field := 'stream_id'; v_why := 'is empty, only white space, or holds a control character';
        ELSIF p_expected[i] < -1 THEN
            v_field := 'expected_version'; v_why := 'is below -1';
        ELSIF p_expected[i] > 9223372036854775807 - v_events THEN
            v_field := 'expected_version'; v_why := 'leaves no room for the events';
        ELSIF EXISTS (SELECT 1 FROM generate_series(1, i - 1) j WHERE p_streams[j] = p_streams[i]) THEN
            v_field := 'stream_id'; v_why := 'appears in two appends of one call';
        END IF;
        EXIT WHEN v_field IS NOT NULL;
    END LOOP;
    IF v_field IS NULL THEN
        v_append := NULL;
        FOR i IN 1 .. v_events LOOP
            v_at := i;
            v_append := p_append[i];
            IF p_append[i] IS NULL OR p_index[i] IS NULL
               OR (CASE WHEN i = 1 THEN p_append[i] <> 1 OR p_index[i] <> 1
                        WHEN p_append[i] = p_append[i - 1] THEN p_index[i] <> p_index[i - 1] + 1
                        ELSE p_append[i] <> p_append[i - 1] + 1 OR p_index[i] <> 1 END)
               OR (i = v_events AND p_append[i] <> v_appends) THEN
                v_field := 'index'; v_why := 'breaks the order: events go append by append (1..n), numbered 1, 2, ... within each';
            ELSIF p_ids[i] IS NULL OR EXISTS (SELECT 1 FROM generate_series(1, i - 1) j WHERE p_ids[j] = p_ids[i]) THEN
                v_field := 'event_id'; v_why := 'is missing or appears twice in one call';
            ELSIF octet_length(p_types[i]) > 256 THEN
                v_field := 'type'; v_limit := 256; v_size := octet_length(p_types[i]);
                v_why := format('is %s bytes; the limit is 256', v_size);
            ELSIF p_types[i] IS NULL OR p_types[i] !~ v_name THEN
                v_field := 'type'; v_why := 'is empty, only white space, or holds a control character';
            ELSIF starts_with(p_types[i], '$stream.') THEN
                v_field := 'type'; v_why := 'starts with "$stream.", which is reserved for annals';
            ELSIF octet_length(p_data[i]) + coalesce(octet_length(p_metadata[i]), 0) > 67108864 THEN
                v_field := 'data+metadata'; v_limit := 67108864;
                v_size := octet_length(p_data[i]) + coalesce(octet_length(p_metadata[i]), 0);
                v_why := format('is %s bytes; the limit is 67108864 (64 MiB)', v_size);
            ELSIF p_data[i] IS NULL OR left(ltrim(p_data[i], E' \t\r\n'), 1) NOT IN ('{', '[') THEN
                v_field := 'data'; v_why := 'is not a JSON object or array';
            ELSIF NOT {{.Schema}}.jsonb_storable(p_data[i]) THEN
                v_field := 'data'; v_why := 'is not JSON that jsonb can hold (a NUL character escape, an unpaired surrogate, or a number beyond numeric''s range)';
            ELSIF coalesce(p_metadata[i], '') <> ''
                  AND (left(ltrim(p_metadata[i], E' \t\r\n'), 1) <> '{' OR NOT {{.Schema}}.jsonb_storable(p_metadata[i])) THEN
                v_field := 'metadata'; v_why := 'is not a JSON object that jsonb can hold';
            ELSIF coalesce(p_metadata[i], '') <> '' AND NOT {{.Schema}}.metadata_ok(p_metadata[i]::jsonb) THEN
                v_field := 'metadata';
                v_why := 'has a key over 256 bytes, or a reserved key of the wrong type (correlation_id, causation_id, traceparent, tracestate: strings; schema_version: a positive integer)';
            END IF;
            EXIT WHEN v_field IS NOT NULL;
        END LOOP;
        IF v_field IS NULL THEN
            v_at := 0; v_append := NULL;
            v_field := 'index'; v_why := 'leaves an append without events';
        END IF;
    END IF;
    RAISE EXCEPTION 'annals: append_batch: % %', v_field, v_why
        USING ERRCODE = 'AN002',
              DETAIL = json_build_object('event', v_at, 'append', v_append, 'field', v_field,
                                         'limit', v_limit, 'actual', v_size)::text;
END
$fn$;

-- forget_subject as in 0031, plus: a subject over 1024 bytes is refused,
-- and an event whose data jsonb cannot hold is not cast (its stream counts
-- as one of the subject's when the text holds "$personal").
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
    -- personal_keys holds subjects of at most 1024 bytes: a longer one
    -- never had a key, so nothing of it can be in clear anywhere.
    IF octet_length(p_subject) > 1024 THEN
        RAISE EXCEPTION 'annals: subject is % bytes; the limit is 1024', octet_length(p_subject)
            USING ERRCODE = 'AN002',
                  DETAIL = json_build_object('event', 0, 'field', 'subject', 'limit', 1024,
                                             'actual', octet_length(p_subject))::text;
    END IF;
    -- As in 0026: READ COMMITTED only, so the DELETE below (a statement
    -- taking its snapshot after the lock) sees every snapshot written by a
    -- writer that checked the subject's key before it was destroyed.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'annals: forget_subject must run in a READ COMMITTED transaction, not %',
            current_setting('transaction_isolation') USING ERRCODE = '25000';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended({{.SchemaLiteral}} || ':forget', 0));
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
    -- The CASE decides before any cast: a text jsonb_may_overflow passes
    -- is cast; one it flags is cast only if jsonb_storable says it can be.
    WITH snapped AS (
        SELECT DISTINCT sn.stream_id FROM {{.Schema}}.snapshots sn
    ), s AS (
        SELECT sp.stream_id
          FROM snapped sp
         WHERE EXISTS (SELECT 1 FROM {{.Schema}}.events e
                        WHERE e.stream_id = sp.stream_id
                          AND strpos(e.data::text, '"$personal"') > 0
                          AND CASE WHEN {{.Schema}}.jsonb_may_overflow(e.data::text)
                                        AND NOT {{.Schema}}.jsonb_storable(e.data::text) THEN true
                                   ELSE jsonb_path_exists(e.data::jsonb, '$.*."$personal" ? (@.subject == $s)',
                                                          jsonb_build_object('s', p_subject)) END)
            OR EXISTS (SELECT 1 FROM {{.Schema}}.events_archive a
                        WHERE a.stream_id = sp.stream_id
                          AND strpos(a.data::text, '"$personal"') > 0
                          AND CASE WHEN {{.Schema}}.jsonb_may_overflow(a.data::text)
                                        AND NOT {{.Schema}}.jsonb_storable(a.data::text) THEN true
                                   ELSE jsonb_path_exists(a.data::jsonb, '$.*."$personal" ? (@.subject == $s)',
                                                          jsonb_build_object('s', p_subject)) END)
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

-- scavenge as in 0027, plus: a removed event with personal data that jsonb
-- cannot hold (opaque) is not cast, and every snapshot of its stream goes;
-- subjects over 1024 bytes are not recorded in personal_streams.
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
    -- personal: the data holds "$personal"; opaque: it does, and jsonb
    -- cannot hold the data. Only personal rows that are not opaque are
    -- cast (the CASE decides before the cast).
    WITH gone AS (
        DELETE FROM {{.Schema}}.events e
         USING {{.Schema}}.streams s
         WHERE e.global_sequence > r.scanned_to AND e.global_sequence <= v_to
           AND s.stream_id = e.stream_id
           AND (s.state = 2
                OR e.stream_version < s.truncate_before
                OR e.stream_version <= s.version - s.max_count
                OR e.recorded_at < r.now_at - s.max_age)
        RETURNING e.stream_id, e.stream_version, e.data, s.state,
                  strpos(e.data::text, '"$personal"') > 0 AS personal
    ), checked AS (
        SELECT g.*, g.personal AND {{.Schema}}.jsonb_may_overflow(g.data::text)
                    AND NOT {{.Schema}}.jsonb_storable(g.data::text) AS opaque
          FROM gone g
    ), linked AS (
        INSERT INTO {{.Schema}}.personal_streams (subject, stream_id)
        SELECT DISTINCT p.subject #>> '{}', g.stream_id
          FROM checked g
         CROSS JOIN LATERAL jsonb_path_query(CASE WHEN g.personal AND NOT g.opaque THEN g.data::jsonb END,
                                             '$.*."$personal".subject') AS p(subject)
         WHERE coalesce(p.subject #>> '{}', '') <> '' AND octet_length(p.subject #>> '{}') <= 1024
        ON CONFLICT DO NOTHING
    ), snaps AS (
        DELETE FROM {{.Schema}}.snapshots sn
         USING (SELECT g.stream_id, max(g.stream_version) AS v, bool_or(g.state = 2 OR g.opaque) AS hard
                  FROM checked g GROUP BY g.stream_id) g
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
        RETURNING e.stream_id, e.stream_version, e.data, s.state,
                  strpos(e.data::text, '"$personal"') > 0 AS personal
    ), checked AS (
        SELECT g.*, g.personal AND {{.Schema}}.jsonb_may_overflow(g.data::text)
                    AND NOT {{.Schema}}.jsonb_storable(g.data::text) AS opaque
          FROM gone g
    ), linked AS (
        INSERT INTO {{.Schema}}.personal_streams (subject, stream_id)
        SELECT DISTINCT p.subject #>> '{}', g.stream_id
          FROM checked g
         CROSS JOIN LATERAL jsonb_path_query(CASE WHEN g.personal AND NOT g.opaque THEN g.data::jsonb END,
                                             '$.*."$personal".subject') AS p(subject)
         WHERE coalesce(p.subject #>> '{}', '') <> '' AND octet_length(p.subject #>> '{}') <= 1024
        ON CONFLICT DO NOTHING
    ), snaps AS (
        DELETE FROM {{.Schema}}.snapshots sn
         USING (SELECT g.stream_id, max(g.stream_version) AS v, bool_or(g.state = 2 OR g.opaque) AS hard
                  FROM checked g GROUP BY g.stream_id) g
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

-- max_age_fixed returns an interval of p_age's length in seconds
-- (extract(epoch): a day 24 hours, a month 30 days, a year 365.25 days) as
-- hours and seconds only, to the microsecond; for lengths within 2^31 - 1
-- hours.
CREATE FUNCTION {{.Schema}}.max_age_fixed(p_age interval)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN make_interval(hours => div(extract(epoch FROM p_age), 3600)::int,
                     secs => mod(extract(epoch FROM p_age), 3600)::float8);

-- set_stream_retention as in 0024, plus: max_age is at most 292 years and
-- stored as a fixed length (max_age_fixed).
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
                              'max_age_seconds', extract(epoch FROM s.max_age)::float8, 'max_count', s.max_count),
            v_now);
    PERFORM pg_notify({{.Channel}}, v_seq::text);
    RETURN QUERY SELECT s.version, s.state, s.truncate_before, s.max_age, s.max_count, v_id, v_seq;
END
$fn$;

COMMENT ON FUNCTION {{.Schema}}.set_stream_retention(text, interval, bigint, bigint) IS
    'annals: set a stream''s max age (at most 292 years, stored as a fixed length), max count and truncate-before; appends "$stream.truncated" to "$$<stream>". See docs/sql-api.md.';

-- Stored ages as set_stream_retention now stores them (see the header): a
-- length within 292 years kept to the microsecond, a longer one 292 years,
-- one that is not positive no limit.
UPDATE {{.Schema}}.streams x
   SET max_age = f.age
  FROM (SELECT y.stream_id,
               CASE WHEN extract(epoch FROM y.max_age) <= 0 THEN NULL
                    WHEN extract(epoch FROM y.max_age) > 9214819200 THEN interval '2559672 hours'
                    ELSE {{.Schema}}.max_age_fixed(y.max_age) END AS age
          FROM {{.Schema}}.streams y
         WHERE y.max_age IS NOT NULL) f
 WHERE x.stream_id = f.stream_id
   -- Compared as text: '30 days' = '720:00:00' as intervals.
   AND x.max_age::text IS DISTINCT FROM f.age::text;
