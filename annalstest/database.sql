-- Statements the test harness runs on the server's admin database.
-- :"db" and :"template" are database names, substituted as quoted identifiers
-- (as psql variables are); $1, $2 are bind parameters.

-- name: ServerVersion
SELECT current_setting('server_version_num')::int;

-- name: DatabaseExists
SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1);

-- name: LockTemplate
SELECT pg_advisory_lock($1, $2);

-- name: DropDatabase
DROP DATABASE IF EXISTS :"db" WITH (FORCE);

-- name: CreateEmptyDatabase
CREATE DATABASE :"db" TEMPLATE template0;

-- name: SealTemplate
ALTER DATABASE :"db" WITH ALLOW_CONNECTIONS false;

-- name: PublishTemplate
ALTER DATABASE :"db" RENAME TO :"template";

-- name: CloneTemplate
CREATE DATABASE :"db" TEMPLATE :"template";
