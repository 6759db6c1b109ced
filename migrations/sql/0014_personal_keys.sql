-- annals schema: forgetting people (crypto-shredding).
--
-- Fields of event types registered with eventstore.PersonalData are
-- encrypted in Go, before the append, with a data key of their subject (a
-- customer ID, say): AES-256-GCM, a random nonce per field. personal_keys
-- holds one row per subject: the data key wrapped (encrypted) by the
-- application's key-encryption key, which the database never sees.
--
-- forget_subject destroys a subject's key: wrapped_key becomes NULL and
-- forgotten_at is set, and the row stays as a tombstone, so that no later
-- append can create a new key for the subject (appends of its personal data
-- are refused in Go). The events stay in the log with their positions; their
-- personal fields can no longer be decrypted and read as redacted values. The
-- function also deletes the snapshots of every stream holding an event with
-- personal data of the subject (snapshots are caches: loads replay the
-- stream, now redacted).
--
-- Privileges: readers SELECT the table (a wrapped key is useless without the
-- key-encryption key; reads need to know whether a subject is forgotten),
-- writers also INSERT (a subject's first append creates its key) and EXECUTE
-- forget_subject, which runs as the schema's owner: nobody gets UPDATE or
-- DELETE on the table or DELETE on snapshots for this.

CREATE TABLE {{.Schema}}.personal_keys (
    subject      text        PRIMARY KEY CHECK (subject <> '' AND octet_length(subject) <= 1024),
    wrapped_key  bytea       CHECK (wrapped_key IS NULL OR octet_length(wrapped_key) <= 4096),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    forgotten_at timestamptz,
    CHECK ((wrapped_key IS NULL) = (forgotten_at IS NOT NULL))
);

COMMENT ON TABLE {{.Schema}}.personal_keys IS
    'annals: per-subject data keys (wrapped by the application''s key-encryption key) for personal fields of events; a forgotten subject keeps a row with no key.';

-- forget_subject(subject) destroys subject's data key (a tombstone row is
-- left, or made when the subject never had a key) and deletes the snapshots
-- of the streams whose events carry its personal data (top-level fields
-- holding {"$personal": {"subject": subject, ...}}). It returns whether the
-- subject had a key before and how many snapshots were deleted. Finding the
-- streams reads every event holding personal data: a rare, operator-sized
-- operation.
CREATE FUNCTION {{.Schema}}.forget_subject(p_subject text)
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
          FROM {{.Schema}}.events e
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

REVOKE ALL ON FUNCTION {{.Schema}}.forget_subject(text) FROM PUBLIC;

COMMENT ON FUNCTION {{.Schema}}.forget_subject(text) IS
    'annals: destroy a subject''s data key (crypto-shredding its personal data in the log) and delete snapshots of its streams. See docs/operations.md.';

-- Upgraded databases keep their roles as capable as annals grant makes new
-- ones: whoever may read the log may read the keys table, whoever may append
-- through append_batch may create keys and forget subjects.
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
        EXECUTE pg_catalog.format('GRANT SELECT ON %I.personal_keys TO %s', v_schema, r.who);
    END LOOP;
    FOR r IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) AS who
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = pg_catalog.format('%I.append_batch(text[], bigint[], int[], int[], uuid[], text[], text[], text[], boolean)', v_schema)::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT INSERT ON %I.personal_keys TO %s', v_schema, r.who);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.forget_subject(text) TO %s', v_schema, r.who);
    END LOOP;
END
$grants$;
