-- annals schema: the two functions whose bodies could have bound to objects
-- planted in the migrating session's search_path are bound to pg_catalog.
--
-- A LANGUAGE sql function with a RETURN body is parsed when it is created:
-- its calls keep the functions and operators they resolved to then, under
-- the search_path of the session that ran the migration ("$user", public
-- by default, until Up pinned it to pg_catalog with this migration's
-- release). pg_catalog is searched first, but a call that pg_catalog
-- matches only through an implicit cast goes to an exact match elsewhere:
-- stream_partition's `bigint & 2147483647` and `% p_partitions` (bigint
-- and integer: pg_catalog has bigint and bigint), max_age_fixed's
-- div(numeric, 3600) and mod(numeric, 3600) (numeric and integer). A role
-- that could create objects in public (every role on PostgreSQL 14 and
-- older unless the DBA revoked it) could plant such an operator or function
-- before the schema was migrated; max_age_fixed then ran it as the schema's
-- owner inside set_stream_retention, which every writer may call, and
-- stream_partition ran it as every role that reads by partition. The other
-- functions with a RETURN body call only what pg_catalog matches exactly.
--
-- Both are created again with the same bodies, each name and operator
-- qualified and each cast written out (the ones PostgreSQL added): the same
-- results, bound to pg_catalog whatever the search_path, which Up now also
-- pins for every migration. Signatures, owner and grants are kept (CREATE
-- OR REPLACE).

CREATE OR REPLACE FUNCTION {{.Schema}}.stream_partition(p_stream_id text, p_partitions integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN ((('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.md5(p_stream_id), 1, 8))::pg_catalog.bit(32)::pg_catalog.int4)::pg_catalog.int8
        OPERATOR(pg_catalog.&) 2147483647::pg_catalog.int8)
       OPERATOR(pg_catalog.%) p_partitions::pg_catalog.int8;

CREATE OR REPLACE FUNCTION {{.Schema}}.max_age_fixed(p_age interval)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pg_catalog.make_interval(hours => pg_catalog.div(extract(epoch FROM p_age), 3600::pg_catalog.numeric)::pg_catalog.int4,
                                secs => pg_catalog.mod(extract(epoch FROM p_age), 3600::pg_catalog.numeric)::pg_catalog.float8);
