-- annals schema: forget_subject reads only the events of streams that have
-- snapshots.
--
-- forget_subject (0026) found the snapshots to delete by scanning every
-- event of the log, hot and archived, for the subject's personal data, and
-- then deleting the snapshots of the streams it found. It holds the forget
-- lock exclusively meanwhile, so on a log of millions of events every
-- Forget took as long as a full scan of it, and in that time snapshot
-- writes were skipped and scavenge steps (which take the lock shared)
-- waited. Only streams that have a snapshot can lose one, so the scan now
-- starts from the snapshots: for each stream holding one, its events are
-- read through the (stream_id, stream_version) index of events and of
-- events_archive, and the stream is taken when one of them carries the
-- subject's personal data. The streams found, and so the rows deleted,
-- are the same as before (the DELETE joined the snapshots on stream_id);
-- the cost follows the events of snapshotted streams, not the log.
--
-- The set of snapshots cannot change under the scan: a snapshot write
-- holds the forget lock shared until it commits, and this function holds
-- it exclusively from before the statement that reads them (READ
-- COMMITTED: the statement's snapshot is taken after the lock).

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
    WITH snapped AS (
        SELECT DISTINCT sn.stream_id FROM {{.Schema}}.snapshots sn
    ), s AS (
        SELECT sp.stream_id
          FROM snapped sp
         WHERE EXISTS (SELECT 1 FROM {{.Schema}}.events e
                        WHERE e.stream_id = sp.stream_id
                          AND strpos(e.data::text, '"$personal"') > 0
                          AND jsonb_path_exists(e.data::jsonb, '$.*."$personal" ? (@.subject == $s)',
                                                jsonb_build_object('s', p_subject)))
            OR EXISTS (SELECT 1 FROM {{.Schema}}.events_archive a
                        WHERE a.stream_id = sp.stream_id
                          AND strpos(a.data::text, '"$personal"') > 0
                          AND jsonb_path_exists(a.data::jsonb, '$.*."$personal" ? (@.subject == $s)',
                                                jsonb_build_object('s', p_subject)))
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
