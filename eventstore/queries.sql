-- Statements of the eventstore package. {{.Schema}} is the quoted schema name.

-- name: Append
-- An append in a transaction (AppendTx, Transact, the encoded appends) or
-- alone (a failed group's re-send): append_events_json (migration 0035)
-- stores data and metadata as sent; $3 is sent as json, whose text it keeps.
SELECT event_id, global_sequence, stream_version
  FROM {{.Schema}}.append_events_json($1, $2, $3::json);

-- name: AppendJSONB
-- Append on a schema migrated before 0035, or for a role granted
-- append_events only: jsonb stores its rendering of the events.
SELECT event_id, global_sequence, stream_version
  FROM {{.Schema}}.append_events($1, $2, $3::jsonb);

-- name: AppendFunction
-- Which function appends in a transaction of this session, whatever role
-- the session takes with SET ROLE, in two answers: the first for a role in
-- effect that is not a superuser (any of them that the session's user is
-- a member of: itself and the roles granted to it; every one, for a
-- superuser), the second for one that is (is_superuser, which the server
-- reports as SET ROLE changes it: a superuser may execute any function).
-- 1, append_events_json, when every such role that may execute
-- append_events may execute append_events_json too; 2, append_events, when
-- none may execute append_events_json (the schema predates it); 3, roles
-- of both kinds: ask AppendJSONUsable in each transaction. A superuser's
-- own appends so never depend on the grants of other roles of the cluster.
-- The third answer is the first over every role the user is a member of,
-- superusers included (as before the split): for a session whose
-- is_superuser is not reported (a proxy that reports no parameters), where
-- the role in effect may be either.
-- (Names are arguments of format, so that the statement does not read as a
-- call of an append function: internal/locktrace looks for one.)
WITH f AS (
    SELECT to_regprocedure(format('%I.%I(pg_catalog.text, pg_catalog.int8, pg_catalog.json)', {{.SchemaLiteral}}, 'append_events_json')) AS js,
           to_regprocedure(format('%I.%I(pg_catalog.text, pg_catalog.int8, pg_catalog.jsonb)', {{.SchemaLiteral}}, 'append_events')) AS jb
), r AS (
    SELECT a.rolsuper AS super,
           f.js IS NOT NULL AND has_function_privilege(a.oid, f.js, 'EXECUTE') AS js,
           f.jb IS NOT NULL AND has_function_privilege(a.oid, f.jb, 'EXECUTE') AS jb
      FROM f, pg_catalog.pg_roles a
     WHERE pg_has_role(session_user, a.oid, 'MEMBER')
)
SELECT CASE WHEN coalesce(bool_and(r.js OR NOT r.jb) FILTER (WHERE NOT r.super), true) THEN 1
            WHEN NOT coalesce(bool_or(r.js) FILTER (WHERE NOT r.super), false) THEN 2
            ELSE 3 END,
       CASE WHEN (SELECT f.js FROM f) IS NOT NULL THEN 1 ELSE 2 END,
       CASE WHEN coalesce(bool_and(r.js OR NOT r.jb), true) THEN 1
            WHEN NOT coalesce(bool_or(r.js), false) THEN 2
            ELSE 3 END
  FROM r;

-- name: AppendJSONUsable
-- Whether the role in effect in this session may execute append_events_json
-- (false: the schema predates it, or the role was granted append_events
-- only).
-- (The name is an argument of format, so that the statement does not read
-- as a call of the function: internal/locktrace looks for one.)
SELECT coalesce(has_function_privilege(
           to_regprocedure(format('%I.%I(pg_catalog.text, pg_catalog.int8, pg_catalog.json)', {{.SchemaLiteral}}, 'append_events_json')), 'EXECUTE'),
       false);

-- name: AppendBatch
SELECT stream_id, status, event_id, global_sequence, stream_version, actual_version
  FROM {{.Schema}}.append_batch($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: AppendOne
SELECT status, global_sequence, stream_version, actual_version
  FROM {{.Schema}}.append_one($1, $2, $3, $4, $5, $6, $7);

-- name: ReadAll
-- events_all: archived and hot events (a merge of the two tables' position
-- indexes).
SELECT global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at
  FROM {{.Schema}}.events_all
 WHERE global_sequence >= $1
 ORDER BY global_sequence
 LIMIT $2;

-- name: ReadStream
-- A deleted stream reads as nothing (the caller then asks StreamVersion,
-- which says why). The stream's retention hides events at once: those below
-- truncate_before, beyond max_count, or recorded before $4 (now) - max_age.
-- Early versions may be archived: events_all merges both tables' (stream_id,
-- stream_version) indexes.
SELECT e.global_sequence, e.event_id, e.stream_id, e.stream_version, e.event_type, e.data, e.metadata, e.recorded_at
  FROM {{.Schema}}.streams s
  JOIN {{.Schema}}.events_all e
    ON e.stream_id = s.stream_id
   AND e.stream_version >= greatest($2, s.truncate_before, s.version - s.max_count + 1)
   AND (s.max_age IS NULL OR e.recorded_at >= $4::timestamptz - s.max_age)
 WHERE s.stream_id = $1 AND s.state = 0
 ORDER BY e.stream_version
 LIMIT $3;

-- name: StreamVersion
SELECT version, state FROM {{.Schema}}.streams WHERE stream_id = $1;

-- name: Head
-- The newest event is kept in events by archive(); the archive is asked too
-- should the hot events ever be scavenged away.
SELECT greatest((SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events),
                (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events_archive));

-- name: StoredIDs
-- How many of the events of an inline append are stored already.
SELECT count(*)::int FROM {{.Schema}}.events_all WHERE event_id = ANY($1::uuid[]);

-- name: InlineStreamLock
-- The retry lock of inline appends to $1, for this transaction (migration
-- 0034: a writer needs no lock function of PostgreSQL's).
SELECT {{.Schema}}.inline_stream_lock($1);

-- name: InlineStreamLockDirect
-- The same lock on a schema migrated before 0034, which has no
-- inline_stream_lock: the key (inlineLockKey) taken with PostgreSQL's
-- function, as clients before 0034 took it.
SELECT pg_catalog.pg_advisory_xact_lock($1::int4, $2::int4);

-- name: InlineWritten
-- After an inline append with caller-chosen IDs, in the pipeline before its
-- COMMIT: fails (division by zero) unless this transaction wrote every one
-- of the events, i.e. the append did not answer them as an idempotent
-- re-append of events another transaction stored meanwhile. A row's xmin is
-- this transaction's, or a subtransaction's under a savepoint, exactly when
-- pg_xact_status calls it in progress (rows of other transactions still in
-- progress are not visible here). xmin is 32 bits; it is given the epoch of
-- the current transaction ID (a row from the previous epoch makes
-- pg_xact_status fail, which fails the append too, and a retry answers it as
-- an idempotent re-append). A CASE around 1/0 would not do: the planner
-- folds the constant.
SELECT 1 / (count(*) = $2::int)::int
  FROM {{.Schema}}.events
 WHERE event_id = ANY($1::uuid[])
   AND pg_xact_status(((pg_current_xact_id()::text::bigint >> 32 << 32) + xmin::text::bigint)::text::xid8) = 'in progress';
