-- Queries the migrations package runs on its own behalf (not migrations).

-- Every function named with its schema: these run as the schema's owner
-- under the session's search_path, where a function planted in public
-- (parameters untyped: one of float8 matches them better) would run instead.

-- name: Lock
-- The migration lock, for Up's transaction (see up).
SELECT pg_catalog.pg_advisory_xact_lock($1, $2);

-- name: PinSearchPath
-- The second statement of Up's transaction (after the lock): the migrations' unqualified
-- names (in bodies parsed at CREATE, such as LANGUAGE sql functions with a
-- RETURN body, views, defaults and checks, which keep what they resolved to
-- for good) resolve in pg_catalog, never in a schema other roles may create
-- objects in (public, on PostgreSQL 14 and older).
SET LOCAL search_path = pg_catalog, pg_temp;

-- name: Bootstrap
CREATE SCHEMA IF NOT EXISTS {{.Schema}};
CREATE TABLE IF NOT EXISTS {{.Schema}}.schema_migrations (
    version    integer     NOT NULL PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: SchemaOwner
-- The schema's owner, and whether this role may make the log in it: it
-- owns the schema, is a member of the role that does (by membership, not
-- by being a superuser), a superuser owns it, or the database's owner does
-- (also as pg_database_owner, the owner of PostgreSQL 15's public schema):
-- whoever owns the database may drop it whole anyway. The owner of a schema
-- may drop and replace anything in it, whoever made it.
WITH RECURSIVE m(oid) AS (
    SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user
    UNION
    SELECT a.roleid FROM pg_catalog.pg_auth_members a JOIN m ON a.member = m.oid
)
SELECT pg_catalog.pg_get_userbyid(n.nspowner)::text,
       n.nspowner IN (SELECT m.oid FROM m) OR o.rolsuper
       OR o.rolname = 'pg_database_owner'
       OR n.nspowner = (SELECT d.datdba FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
  FROM pg_catalog.pg_namespace n
  JOIN pg_catalog.pg_roles o ON o.oid = n.nspowner
 WHERE n.nspname = {{.SchemaLiteral}};

-- name: Record
INSERT INTO {{.Schema}}.schema_migrations (version, name) VALUES ($1, $2);

-- name: Applied
SELECT version, name, applied_at FROM {{.Schema}}.schema_migrations;

-- name: TableExists
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables
               WHERE schemaname = {{.SchemaLiteral}} AND tablename = 'schema_migrations');
