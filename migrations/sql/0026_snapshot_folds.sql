-- annals schema: snapshots say which events they fold, and are written
-- under a lock forget_subject takes.
--
-- Two bugs (package aggregate):
--
-- - A Save after Forget wrote the aggregate's state, decrypted before the
--   Forget (or by another process within its key cache's TTL), to the
--   snapshots: the forgotten subject's personal data stayed there in clear
--   (guarantees.md §16 says no byte of it does). A snapshot write now takes
--   the advisory lock <schema>:forget shared (pg_try_advisory_xact_lock_
--   shared: while a Forget runs it is skipped, never waited for), and, in a
--   statement of its own after it, writes the row only if no event the
--   state folds carries personal data of a subject whose key is gone.
--   forget_subject takes the same lock exclusively before it destroys the
--   key, so the two serialise: a write that got the lock first committed
--   before forget_subject's scan of the snapshots to delete (which deletes
--   it); a write that comes after sees the key destroyed and writes nothing.
--
-- - A load used a snapshot that folded events a truncation has hidden since,
--   so it returned another state than a replay of the visible events.
--   first_version is the first stream version the snapshot's state folds
--   (the stream's first visible version when the aggregate was loaded), and
--   checked_version the stream_version the row had when a writer of this
--   protocol wrote it: a row whose checked_version is not its stream_version
--   was written (or overwritten) by older code, which recorded neither, and
--   is taken to fold the stream from version 1. A load uses a snapshot only
--   when it folds exactly the stream's visible events up to its version.
--
-- Snapshots built from events a scavenge run removed before 0027 (whose
-- steps delete them since) go now: each row whose stream no longer holds
-- its version 1 or the row's own version (up to the stream's version). A
-- row older code wrote folds its stream from version 1, and scavenging
-- removes a stream's oldest versions (all of a hard-deleted stream's): such
-- a row holds state built from removed events (a hard-deleted stream's
-- decrypted state, say), and no load can use it. An index on (stream_id,
-- stream_version) lets a scavenge step find a stream's snapshots (and
-- forget_subject, which deletes by stream).
--
-- forget_subject now refuses to run in a REPEATABLE READ or SERIALIZABLE
-- transaction (SQLSTATE 25000, invalid_transaction_state). Otherwise it is
-- 0023's. Writers need no new privilege (they read events_all, streams and
-- personal_keys already; advisory locks need none).
--
-- Upgrading: migrations.Up applies all pending migrations in one
-- transaction, so each lock taken here is held until the whole upgrade
-- commits. The statements that read the whole snapshots table (time
-- proportional to its size) therefore come before the ALTER TABLE:
--
-- - the DELETE takes row locks only (a snapshot write of a row it deletes
--   waits);
-- - the index build takes a SHARE lock: snapshot writes (Saves with
--   snapshots configured return late) and forget_subject wait from here to
--   the end of the upgrade; loads go on;
-- - the ALTER TABLE takes ACCESS EXCLUSIVE: every load of an aggregate
--   with snapshots configured waits from here to the end of the upgrade
--   (the rest of this file, 0027 and any later pending migration). Its
--   columns are nullable without a default and its CHECK is added NOT
--   VALID (the existing rows all hold NULL there, which passes it; new
--   rows are checked), so it changes the catalog only, reading and
--   rewriting nothing. It first waits for the loads in progress, and new
--   loads queue behind it meanwhile.
--
-- docs/operations.md ("Migrations") has operators upgrade in a quiet
-- moment, with a lock_timeout.

DELETE FROM {{.Schema}}.snapshots sn
 WHERE EXISTS (SELECT 1 FROM {{.Schema}}.streams s
                WHERE s.stream_id = sn.stream_id AND s.version >= sn.stream_version)
   AND (NOT EXISTS (SELECT 1 FROM {{.Schema}}.events_all e
                     WHERE e.stream_id = sn.stream_id AND e.stream_version = 1)
        OR NOT EXISTS (SELECT 1 FROM {{.Schema}}.events_all e
                        WHERE e.stream_id = sn.stream_id AND e.stream_version = sn.stream_version));

CREATE INDEX snapshots_stream ON {{.Schema}}.snapshots (stream_id, stream_version);

ALTER TABLE {{.Schema}}.snapshots
    ADD COLUMN first_version   bigint,
    ADD COLUMN checked_version bigint,
    ADD CONSTRAINT snapshots_first_version_check CHECK (first_version > 0) NOT VALID;

COMMENT ON COLUMN {{.Schema}}.snapshots.first_version IS
    'annals: the first stream version the state folds (NULL: unknown, taken as 1).';
COMMENT ON COLUMN {{.Schema}}.snapshots.checked_version IS
    'annals: stream_version as the writer that checked the subjects of its personal data wrote it; another value: written by older code.';

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
    -- Snapshot writes hold this lock shared from before they check the
    -- subjects of their state until they commit: once it is ours, every
    -- write that checked before the key is destroyed has committed (the
    -- DELETE below, a statement taking its snapshot after the lock, sees its
    -- row), and every later one sees it destroyed. Under REPEATABLE READ the
    -- DELETE would read the transaction's snapshot, taken before the lock,
    -- and miss such a row: refused rather than leave personal data behind.
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
