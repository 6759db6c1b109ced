-- annals schema: metadata_ok in PL/pgSQL.
--
-- metadata_ok (0009) was a SQL-language function whose body holds a
-- sub-select (the key-length check), so the planner cannot inline it, and a
-- non-inlined SQL function is planned again at every call site's execution:
-- append_batch paid a fresh plan for each call whose events carry metadata
-- (perf of a backend running single-event appends with metadata: 21% of
-- its CPU under fmgr_sql, 9% in the planner, 9% in stringToNode). A
-- PL/pgSQL function keeps its plans for the session. Same rules, same
-- result; the names are schema-qualified because, unlike the SQL-standard
-- body it replaces, a PL/pgSQL body is resolved when it runs.
-- Single-event append_batch calls with metadata, pgbench, fsync on:
-- 1,650-1,780 -> 1,860-2,010 per second.
CREATE OR REPLACE FUNCTION {{.Schema}}.metadata_ok(p_md jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $fn$
BEGIN
    RETURN pg_catalog.jsonb_typeof(p_md) = 'object'
       AND coalesce(pg_catalog.jsonb_typeof(p_md OPERATOR(pg_catalog.->) 'correlation_id'), 'string') = 'string'
       AND coalesce(pg_catalog.jsonb_typeof(p_md OPERATOR(pg_catalog.->) 'causation_id'), 'string') = 'string'
       AND coalesce(pg_catalog.jsonb_typeof(p_md OPERATOR(pg_catalog.->) 'traceparent'), 'string') = 'string'
       AND coalesce(pg_catalog.jsonb_typeof(p_md OPERATOR(pg_catalog.->) 'tracestate'), 'string') = 'string'
       AND CASE WHEN p_md OPERATOR(pg_catalog.->) 'schema_version' IS NULL THEN true
                WHEN pg_catalog.jsonb_typeof(p_md OPERATOR(pg_catalog.->) 'schema_version') = 'number'
                THEN (p_md OPERATOR(pg_catalog.->>) 'schema_version')::numeric BETWEEN 1 AND 2147483647
                     AND (p_md OPERATOR(pg_catalog.->>) 'schema_version')::numeric
                         = pg_catalog.trunc((p_md OPERATOR(pg_catalog.->>) 'schema_version')::numeric)
                ELSE false END
       AND (pg_catalog.pg_column_size(p_md) <= 256
            OR NOT EXISTS (SELECT 1 FROM pg_catalog.jsonb_object_keys(p_md) k
                            WHERE pg_catalog.octet_length(k) > 256));
END
$fn$;
