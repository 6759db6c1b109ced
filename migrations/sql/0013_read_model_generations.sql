-- annals schema v11 (assigned number 0016: the loader refuses gaps, so it is 0011 in this branch): blue/green read models (projection.BlueGreen).
--
-- A versioned projection's read model lives in one PostgreSQL schema per
-- generation; readers query views in a reader schema that point at the live
-- generation's relations. A blue/green rebuild sets up a new generation,
-- replays the log into it under its own subscriber (and checkpoints), and
-- cuts over in one short transaction: the views are swapped and the states
-- below flipped together, so readers go from a complete old read model to a
-- complete new one. The old generation is kept (state retired) for
-- `projections rollback` until its retention ends; then its schema is
-- dropped (state dropped; the row stays as history, and so that a version is
-- never rebuilt automatically twice).

CREATE TABLE {{.Schema}}.read_model_generations (
    projection       text        NOT NULL CHECK (projection <> ''),
    generation       integer     NOT NULL CHECK (generation > 0),
    version          integer     NOT NULL CHECK (version > 0),
    schema_name      text        NOT NULL UNIQUE CHECK (schema_name <> ''),
    reader_schema    text        NOT NULL CHECK (reader_schema <> ''),
    subscriber       text        NOT NULL UNIQUE CHECK (subscriber <> ''),
    state            text        NOT NULL CHECK (state IN ('building', 'live', 'retired', 'dropped')),
    created_by       text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    live_since       timestamptz,
    retired_at       timestamptz,
    dropped_at       timestamptz,
    -- The cut-over that made this generation live: its transaction's
    -- duration up to COMMIT, and the position the generation had reached.
    cutover_ms       double precision,
    cutover_position bigint,
    PRIMARY KEY (projection, generation)
);

-- At most one live generation per projection.
CREATE UNIQUE INDEX read_model_generations_live
    ON {{.Schema}}.read_model_generations (projection) WHERE state = 'live';

COMMENT ON TABLE {{.Schema}}.read_model_generations IS
    'annals: the generations (one schema each) of blue/green read models, and which one readers see (projection.BlueGreen).';

-- Creates the schema of a registered generation. Runs with the caller's
-- rights (it owns the read model); the name comes from the registry and is
-- quoted with %I.
CREATE FUNCTION {{.Schema}}.read_model_create_schema(p_projection text, p_generation integer)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_schema text;
BEGIN
    SELECT g.schema_name INTO v_schema
      FROM {{.Schema}}.read_model_generations g
     WHERE g.projection = p_projection AND g.generation = p_generation AND g.state IN ('building', 'live');
    IF v_schema IS NULL THEN
        RAISE EXCEPTION 'annals: read model % has no generation % being built', p_projection, p_generation
            USING ERRCODE = 'P0002';
    END IF;
    EXECUTE pg_catalog.format('CREATE SCHEMA %I', v_schema);
    RETURN v_schema;
END;
$fn$;
REVOKE ALL ON FUNCTION {{.Schema}}.read_model_create_schema(text, integer) FROM PUBLIC;

-- Drops the schema of a retired generation, with everything in it. Only
-- registered, retired generations: never a live one, never another schema.
CREATE FUNCTION {{.Schema}}.read_model_drop_schema(p_projection text, p_generation integer)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_schema text;
BEGIN
    SELECT g.schema_name INTO v_schema
      FROM {{.Schema}}.read_model_generations g
     WHERE g.projection = p_projection AND g.generation = p_generation AND g.state = 'retired';
    IF v_schema IS NULL THEN
        RAISE EXCEPTION 'annals: read model % has no retired generation %', p_projection, p_generation
            USING ERRCODE = 'P0002';
    END IF;
    EXECUTE pg_catalog.format('DROP SCHEMA IF EXISTS %I CASCADE', v_schema);
    RETURN v_schema;
END;
$fn$;
REVOKE ALL ON FUNCTION {{.Schema}}.read_model_drop_schema(text, integer) FROM PUBLIC;

-- Points the reader schema's views at generation schema p_to: drops the views
-- named after p_from's relations (p_from NULL: the first generation, none),
-- creates one view per relation of p_to (SELECT * FROM p_to.relation), and
-- gives each new view the grants its predecessor of the same name had. A
-- relation of the reader schema that is in the way and is not such a view is
-- an error (42P07): nothing changes. Returns the number of views created.
-- Transactional DDL: the caller's transaction makes the swap atomic.
CREATE FUNCTION {{.Schema}}.read_model_swap_views(p_reader text, p_from text, p_to text)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r record;
    g record;
    v_names text[] := '{}';
    v_grants text[] := '{}';
    v_n integer := 0;
BEGIN
    IF p_from IS NOT NULL THEN
        FOR r IN
            SELECT c.oid, c.relname, c.relowner, c.relacl
              FROM pg_catalog.pg_class c
              JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = p_reader AND c.relkind = 'v'
               AND c.relname IN (SELECT c2.relname
                                   FROM pg_catalog.pg_class c2
                                   JOIN pg_catalog.pg_namespace n2 ON n2.oid = c2.relnamespace
                                  WHERE n2.nspname = p_from AND c2.relkind IN ('r', 'p', 'v', 'm', 'f'))
             ORDER BY c.relname
        LOOP
            FOR g IN SELECT a.grantee, a.privilege_type, a.is_grantable
                       FROM pg_catalog.aclexplode(r.relacl) a
                      WHERE a.grantee <> r.relowner
            LOOP
                v_names := v_names || r.relname;
                v_grants := v_grants || pg_catalog.format('GRANT %s ON %I.%I TO %s%s', g.privilege_type, p_reader, r.relname,
                    CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
                    CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
            END LOOP;
            EXECUTE pg_catalog.format('DROP VIEW %I.%I', p_reader, r.relname);
        END LOOP;
    END IF;
    FOR r IN
        SELECT c.relname
          FROM pg_catalog.pg_class c
          JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = p_to AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
         ORDER BY c.relname
    LOOP
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                    WHERE n.nspname = p_reader AND c.relname = r.relname) THEN
            RAISE EXCEPTION 'annals: %.% is in the way of the read model''s view (it is not a view of the previous generation): rename or drop it',
                p_reader, r.relname USING ERRCODE = '42P07';
        END IF;
        EXECUTE pg_catalog.format('CREATE VIEW %I.%I AS SELECT * FROM %I.%I', p_reader, r.relname, p_to, r.relname);
        v_n := v_n + 1;
    END LOOP;
    FOR i IN 1 .. coalesce(pg_catalog.array_length(v_names, 1), 0) LOOP
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                    WHERE n.nspname = p_reader AND c.relname = v_names[i]) THEN
            EXECUTE v_grants[i];
        END IF;
    END LOOP;
    RETURN v_n;
END;
$fn$;
REVOKE ALL ON FUNCTION {{.Schema}}.read_model_swap_views(text, text, text) FROM PUBLIC;
