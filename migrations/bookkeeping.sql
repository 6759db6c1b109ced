-- Queries the migrations package runs on its own behalf (not migrations).

-- name: Lock
SELECT pg_advisory_lock($1, $2);

-- name: Unlock
SELECT pg_advisory_unlock($1, $2);

-- name: Bootstrap
CREATE SCHEMA IF NOT EXISTS {{.Schema}};
CREATE TABLE IF NOT EXISTS {{.Schema}}.schema_migrations (
    version    integer     NOT NULL PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: Record
INSERT INTO {{.Schema}}.schema_migrations (version, name) VALUES ($1, $2);

-- name: Applied
SELECT version, name, applied_at FROM {{.Schema}}.schema_migrations;

-- name: TableExists
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables
               WHERE schemaname = {{.SchemaLiteral}} AND tablename = 'schema_migrations');
