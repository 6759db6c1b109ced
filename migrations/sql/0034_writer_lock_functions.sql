-- annals schema: the two advisory locks a writer's own statements take, as
-- functions of the schema.
--
-- A writer took two advisory locks with PostgreSQL's functions directly: the
-- shared side of Forget's lock before a snapshot write (aggregate
-- SaveSnapshot), and the retry lock of an inline append to one stream
-- (eventstore inline projections). Once `annals advisory-locks restrict` takes
-- those functions from PUBLIC, a writer would need them granted, by a
-- superuser, and with them it could take any key, annals' ordering lock of
-- every schema in the database included. These functions take exactly
-- those two keys, as the schema's owner: writers need no lock function of
-- PostgreSQL's, and their grants no superuser. Both take transaction locks
-- only (given back at COMMIT or ROLLBACK).

-- snapshot_lock takes the shared side of Forget's lock (forget_subject, 0026,
-- takes it exclusively) for the caller's transaction; false: a Forget is
-- running, and the caller skips its snapshot write.
CREATE FUNCTION {{.Schema}}.snapshot_lock() RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT pg_catalog.pg_try_advisory_xact_lock_shared(pg_catalog.hashtextextended({{.SchemaLiteral}} || ':forget', 0));
$fn$;

-- inline_stream_lock waits for the retry lock of inline appends to
-- p_stream, for the caller's transaction. The key is the one the Go client
-- took before (internal/lockkey of "inline" NUL schema NUL stream: the md5's
-- first eight bytes as two int4), so that processes of both versions take
-- turns on one key during a rolling upgrade.
CREATE FUNCTION {{.Schema}}.inline_stream_lock(p_stream text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_md5 text;
    v_void text;
BEGIN
    IF p_stream IS NULL THEN
        RAISE EXCEPTION 'annals: inline_stream_lock: the stream must not be NULL' USING ERRCODE = 'AN002';
    END IF;
    -- decode(): no backslash, whatever standard_conforming_strings says.
    v_md5 := md5(decode('696e6c696e6500', 'hex') || convert_to({{.SchemaLiteral}}, 'UTF8') || decode('00', 'hex')
                 || convert_to(p_stream, 'UTF8'));
    v_void := pg_advisory_xact_lock(('x' || substr(v_md5, 1, 8))::bit(32)::int4,
                                    ('x' || substr(v_md5, 9, 8))::bit(32)::int4);
END
$fn$;

REVOKE ALL ON FUNCTION {{.Schema}}.snapshot_lock() FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.Schema}}.inline_stream_lock(text) FROM PUBLIC;

-- Roles an older `annals grant` made keep working without running it again:
-- whoever may append through append_batch may take the inline retry lock,
-- and whoever may write snapshots may take the snapshot lock.
DO $grants$
DECLARE
    v_schema constant text := {{.SchemaLiteral}};
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) AS who
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid = pg_catalog.format('%I.append_batch(text[], bigint[], int[], int[], uuid[], text[], text[], text[], boolean)',
                                         v_schema)::pg_catalog.regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.inline_stream_lock(text) TO %s', v_schema, r.who);
    END LOOP;
    FOR r IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) AS who
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
         WHERE c.oid = pg_catalog.format('%I.snapshots', v_schema)::pg_catalog.regclass
           AND a.privilege_type = 'INSERT' AND a.grantee <> 0 AND a.grantee <> c.relowner
    LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.snapshot_lock() TO %s', v_schema, r.who);
    END LOOP;
END
$grants$;

COMMENT ON FUNCTION {{.Schema}}.snapshot_lock() IS
    'annals: the shared side of Forget''s lock for a snapshot write, in the caller''s transaction (false: a Forget runs). See aggregate.';
COMMENT ON FUNCTION {{.Schema}}.inline_stream_lock(text) IS
    'annals: the retry lock of inline appends to one stream, in the caller''s transaction. See eventstore inline projections.';
