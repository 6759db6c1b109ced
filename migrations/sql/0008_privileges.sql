-- annals schema v7: the log is written only through annals' functions.
--
-- append_events runs with its owner's rights (SECURITY DEFINER) and a pinned
-- search_path, so a role that appends needs EXECUTE on it and nothing on
-- events or streams: it cannot insert a row of its own (a forged position),
-- update or delete one. Every name in the function's body is qualified with
-- the schema; built-ins resolve in pg_catalog, and pg_temp comes last so that
-- a temporary object can never shadow one. Application roles get what their
-- job needs from `annals grant` (migrations.Grant).
--
-- Keep this migration after any migration that redefines append_events with
-- CREATE OR REPLACE: that statement resets SECURITY DEFINER and the SET
-- clause to the defaults unless it states them again.

ALTER FUNCTION {{.Schema}}.append_events(text, bigint, jsonb)
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION {{.Schema}}.append_events(text, bigint, jsonb) FROM PUBLIC;

-- The trigger function only raises; nobody calls it directly.
ALTER FUNCTION {{.Schema}}.events_append_only()
    SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION {{.Schema}}.events_append_only() FROM PUBLIC;

-- Before this migration a role appended with INSERT on events (the function
-- ran with the caller's rights). Take every write privilege on the log, its
-- sequence and the migration record from every role but the owner; a role
-- that could insert into events keeps appending, through the function only.
-- TRIGGER and REFERENCES go too: a trigger on events would run inside
-- append_events with the owner's rights.
DO $privileges$
DECLARE
    v_schema constant text := {{.SchemaLiteral}};
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT c.relname, c.relkind, g.grantee,
               CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END AS who,
               (c.relname = 'events' AND g.privilege_type = 'INSERT') AS could_append
          FROM pg_catalog.pg_class c
          JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
          CROSS JOIN LATERAL (
                SELECT a.grantee, a.privilege_type FROM pg_catalog.aclexplode(c.relacl) a
                UNION ALL
                SELECT a.grantee, a.privilege_type
                  FROM pg_catalog.pg_attribute att, pg_catalog.aclexplode(att.attacl) a
                 WHERE att.attrelid = c.oid AND att.attacl IS NOT NULL
               ) g
         WHERE n.nspname = v_schema
           AND c.relname IN ('events', 'streams', 'events_global_sequence', 'schema_migrations')
           AND g.grantee <> c.relowner
           AND g.privilege_type <> 'SELECT'
         ORDER BY 1, 3
    LOOP
        IF r.relkind = 'S' THEN
            EXECUTE pg_catalog.format('REVOKE USAGE, UPDATE ON SEQUENCE %I.%I FROM %s CASCADE', v_schema, r.relname, r.who);
        ELSE
            EXECUTE pg_catalog.format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON TABLE %I.%I FROM %s CASCADE',
                                      v_schema, r.relname, r.who);
        END IF;
        IF r.could_append THEN
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %I.append_events(text, bigint, jsonb) TO %s', v_schema, r.who);
        END IF;
    END LOOP;
END
$privileges$;
