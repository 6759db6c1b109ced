-- annals schema: operators no longer read snapshots, and writers insert
-- into personal_keys only the subject and its wrapped key.
--
-- - `annals grant operator` gave SELECT on snapshots ("status and verify
--   read everything"), but nothing an operator runs reads them, and they
--   hold aggregates' state decrypted: an operator read every live
--   subject's personal fields in clear, which guarantees.md §16 keeps from
--   whoever lacks the KEK. It is taken from every role that may run
--   scavenge (the operators, as 0015 identified them) and holds no INSERT
--   or UPDATE on snapshots of its own: a role that is also a writer loads
--   and saves snapshots, and keeps reading them.
--
-- - INSERT on the whole of personal_keys let a writer insert a row with a
--   NULL key, a created_at and a forgotten_at of its choosing: a
--   (backdated) erasure record forget_subject never wrote. Every role
--   granted INSERT on the table (by `annals grant`, or by 0014) now has
--   INSERT on (subject, wrapped_key) only, which is what eventstore's
--   CreateKey inserts: created_at takes its default and forgotten_at stays
--   NULL (the table's CHECK then requires a key). forget_subject, which
--   writes tombstones, runs as the owner.
--
-- REVOKE as the owner (or a superuser, which acts as the owner) takes the
-- grants the owner made; the loops take only those. Revoking a table's
-- INSERT takes the column grants too, so the column grant comes after.
DO $grants$
DECLARE
    v_schema constant text := {{.SchemaLiteral}};
    v_snapshots constant pg_catalog.regclass := pg_catalog.format('%I.snapshots', v_schema)::pg_catalog.regclass;
    v_keys constant pg_catalog.regclass := pg_catalog.format('%I.personal_keys', v_schema)::pg_catalog.regclass;
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee, pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) AS who
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
         WHERE c.oid = v_snapshots
           AND a.privilege_type = 'SELECT' AND a.grantee <> 0 AND a.grantee <> c.relowner
           AND a.grantor = c.relowner
           AND EXISTS (
               SELECT 1
                 FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) x
                WHERE p.oid = pg_catalog.format('%I.scavenge(text, timestamptz, int)', v_schema)::pg_catalog.regprocedure
                  AND x.privilege_type = 'EXECUTE' AND x.grantee = a.grantee)
           AND NOT EXISTS (
               SELECT 1 FROM pg_catalog.aclexplode(c.relacl) w
                WHERE w.grantee = a.grantee AND w.privilege_type IN ('INSERT', 'UPDATE'))
    LOOP
        EXECUTE pg_catalog.format('REVOKE SELECT ON %I.snapshots FROM %s', v_schema, r.who);
    END LOOP;
    FOR r IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) AS who
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
         WHERE c.oid = v_keys
           AND a.privilege_type = 'INSERT' AND a.grantee <> 0 AND a.grantee <> c.relowner
           AND a.grantor = c.relowner
    LOOP
        EXECUTE pg_catalog.format('REVOKE INSERT ON %I.personal_keys FROM %s', v_schema, r.who);
        EXECUTE pg_catalog.format('GRANT INSERT (subject, wrapped_key) ON %I.personal_keys TO %s', v_schema, r.who);
    END LOOP;
END
$grants$;
