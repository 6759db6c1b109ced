-- Statements of the verify package. All run in one REPEATABLE READ READ ONLY
-- transaction, so they see one snapshot of the log. The whole log is read
-- from its two tables (the template's WholeLog: events_archive UNION ALL events),
-- never through the view events_all, which the schema's owner may replace
-- with one showing verify other rows than the tables, and subscribers, read.

-- name: Head
SELECT greatest((SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events),
                (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events_archive));

-- name: CanReadSequence
SELECT coalesce((SELECT pg_catalog.has_sequence_privilege(c.oid, 'SELECT')
                   FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = {{.SchemaLiteral}} AND c.relname = 'events_global_sequence'), false);

-- name: Sequence
-- The last position append_events drew (0 if none). Sequences are not
-- transactional: this is the value now, never lower than at the snapshot.
SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {{.Schema}}.events_global_sequence;

-- name: Lifecycle
-- Streams whose events the scavenger may have removed (deleted, truncated,
-- with a maximum age or count, or with a metadata stream "$$" and the ID,
-- whose records may show an earlier retention), with what the log keeps to
-- check that against:
--   state, version, truncate_before, whether max_count or max_age is set;
--   lossy: the metadata stream has retention of its own or was truncated or
--     deleted (possible before migrations 0021 and 0024): its records may
--     be gone;
--   records: how many "$stream.truncated" records it keeps, the highest
--     truncate_before they record, and whether any records a max_count or
--     max_age; then each record in version order: its position, when it
--     was recorded, its max_count (0: none) and whether it has a max_age;
--   the first and the last event of the stream (version, position);
--   the type, data->>'hard' and position of its event at streams.version,
--     and the type and position of its event at truncate_before - 1 (a
--     deletion sets truncate_before just above its "$stream.deleted"
--     event);
--   the latest deletion record (a "$stream.truncated" record with
--     "deleted", which delete_stream writes since migration 0038): the
--     version of its "$stream.deleted" event, whether it was hard, its
--     position; and whether any record is of a hard deletion.
SELECT s.stream_id, s.state, s.version, s.truncate_before,
       s.max_count IS NOT NULL OR s.max_age IS NOT NULL,
       coalesce(m.state <> 0 OR m.truncate_before > 1 OR m.max_count IS NOT NULL OR m.max_age IS NOT NULL, false),
       r.n, r.truncate_before, coalesce(r.limits, false),
       r.positions, r.times, r.counts, r.ages,
       f.stream_version, f.global_sequence, l.stream_version, l.global_sequence,
       v.event_type, v.hard, v.global_sequence, d.event_type, d.global_sequence,
       dr.version, dr.hard, dr.global_sequence, coalesce(r.any_hard, false)
  FROM {{.Schema}}.streams s
  LEFT JOIN {{.Schema}}.streams m ON m.stream_id = '$$' || s.stream_id
  LEFT JOIN LATERAL (
       SELECT count(*) AS n,
              max(CASE WHEN e.data->>'truncate_before' ~ '^[0-9]{1,18}$' THEN (e.data->>'truncate_before')::bigint END) AS truncate_before,
              bool_or(e.data->>'max_count' IS NOT NULL OR e.data->>'max_age_seconds' IS NOT NULL) AS limits,
              coalesce(array_agg(e.global_sequence ORDER BY e.stream_version), '{}') AS positions,
              coalesce(array_agg(e.recorded_at ORDER BY e.stream_version), '{}') AS times,
              coalesce(array_agg(CASE WHEN e.data->>'max_count' ~ '^[0-9]{1,18}$' THEN (e.data->>'max_count')::bigint ELSE 0 END
                                 ORDER BY e.stream_version), '{}') AS counts,
              coalesce(array_agg(e.data->>'max_age_seconds' IS NOT NULL ORDER BY e.stream_version), '{}') AS ages,
              bool_or(e.data->>'deleted' = 'hard') AS any_hard
         FROM {{.WholeLog}} e
        WHERE e.stream_id = '$$' || s.stream_id AND e.event_type = '$stream.truncated') r ON true
  LEFT JOIN LATERAL (
       SELECT e.stream_version, e.global_sequence FROM {{.WholeLog}} e
        WHERE e.stream_id = s.stream_id ORDER BY e.stream_version, e.global_sequence LIMIT 1) f ON true
  LEFT JOIN LATERAL (
       SELECT e.stream_version, e.global_sequence FROM {{.WholeLog}} e
        WHERE e.stream_id = s.stream_id ORDER BY e.stream_version DESC, e.global_sequence DESC LIMIT 1) l ON true
  LEFT JOIN LATERAL (
       SELECT e.event_type, e.data->>'hard' AS hard, e.global_sequence FROM {{.WholeLog}} e
        WHERE e.stream_id = s.stream_id AND e.stream_version = s.version
        ORDER BY e.global_sequence LIMIT 1) v ON true
  LEFT JOIN LATERAL (
       SELECT e.event_type, e.global_sequence FROM {{.WholeLog}} e
        WHERE e.stream_id = s.stream_id AND e.stream_version = s.truncate_before - 1
        ORDER BY e.global_sequence LIMIT 1) d ON s.truncate_before > 1
  LEFT JOIN LATERAL (
       SELECT CASE WHEN e.data->>'version' ~ '^[0-9]{1,18}$' THEN (e.data->>'version')::bigint END AS version,
              e.data->>'deleted' = 'hard' AS hard, e.global_sequence
         FROM {{.WholeLog}} e
        WHERE e.stream_id = '$$' || s.stream_id AND e.event_type = '$stream.truncated'
          AND e.data->>'deleted' IS NOT NULL
        ORDER BY e.stream_version DESC LIMIT 1) dr ON true
 WHERE s.state <> 0 OR s.truncate_before > 1 OR s.max_count IS NOT NULL OR s.max_age IS NOT NULL
    OR m.stream_id IS NOT NULL
 ORDER BY s.stream_id;

-- name: DeletionsRecordedAfter
-- deletions_recorded_after() (migration 0038): the head of the log when
-- delete_stream began recording deletions in the metadata streams; NULL
-- when the schema lacks it or the role may not execute it.
SELECT CASE WHEN pg_catalog.has_function_privilege(f, 'EXECUTE') THEN true END
  FROM pg_catalog.to_regprocedure(pg_catalog.format('%I.deletions_recorded_after()', {{.SchemaLiteral}})) f
 WHERE f IS NOT NULL;

-- name: DeletionsRecordedAfterValue
SELECT {{.Schema}}.deletions_recorded_after();

-- name: FirstDeletionRecord
-- The position of the first deletion record in the log (a
-- "$stream.truncated" record with "deleted" in a metadata stream, which
-- delete_stream writes since migration 0038), or NULL when there is none.
-- Every deletion without a record lies below it: those made before 0038,
-- and those whose delete_stream call started before 0038 committed (it ran
-- the old function and waited for the migration at the append lock, ahead
-- of every call that started after the commit).
SELECT min(e.global_sequence)
  FROM {{.WholeLog}} e
 WHERE e.event_type = '$stream.truncated' AND starts_with(e.stream_id, '$$')
   AND e.data->>'deleted' IS NOT NULL;

-- name: CanReadMigrations
-- Whether schema_migrations exists, and whether this role may read it.
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = {{.SchemaLiteral}} AND c.relname = 'schema_migrations'),
       coalesce((SELECT pg_catalog.has_table_privilege(c.oid, 'SELECT')
                   FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = {{.SchemaLiteral}} AND c.relname = 'schema_migrations'), false);

-- name: DeletionsRecordedApplied
-- Whether schema_migrations records migration 0038, which created
-- deletions_recorded_after().
SELECT EXISTS (SELECT 1 FROM {{.Schema}}.schema_migrations WHERE version = 38);

-- name: Guards
-- The triggers and unique indexes the log's guarantees rest on that are
-- missing, disabled or changed: the statement-level triggers that keep
-- events append-only and events_archive written only by archive() and
-- scavenge() (enabled: 'O' or 'A'; 'D' is off, 'R' fires only under
-- session_replication_role = replica; with no WHEN condition and no
-- UPDATE OF columns, which let the statements they leave out through), and a valid unique index without a
-- predicate or expressions on the key columns of events, events_archive
-- and streams; and row-level security on a table verify reads (annals
-- enables it on none): its policies can hide rows from the role running
-- verify while other roles read them; and, on those three tables, a
-- trigger or rule annals did not create (a BEFORE INSERT trigger can
-- rewrite each event as it is appended, which no row or baseline shows)
-- or a table inheriting from one (its rows read as the parent's, with
-- none of its triggers or unique indexes). Returns the table, what is
-- wrong, what is there now and what it lets its maker do.
WITH ns AS (
    SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = {{.SchemaLiteral}}
), want_trg(tbl, fn, tgtype) AS (
    VALUES ('events', 'events_append_only', 58), ('events_archive', 'events_archive_guard', 62)
), want_idx(tbl, cols) AS (
    VALUES ('events', ARRAY['global_sequence']), ('events', ARRAY['event_id']),
           ('events', ARRAY['stream_id', 'stream_version']),
           ('events_archive', ARRAY['global_sequence']), ('events_archive', ARRAY['event_id']),
           ('events_archive', ARRAY['stream_id', 'stream_version']),
           ('streams', ARRAY['stream_id'])
)
SELECT w.tbl,
       pg_catalog.format('the trigger running %s.%s() before UPDATE, DELETE and TRUNCATE%s, for each statement, is missing, disabled or narrowed (a WHEN condition, UPDATE OF columns)',
                         {{.SchemaLiteral}}, w.fn, CASE WHEN w.tgtype = 62 THEN ' and INSERT' ELSE '' END),
       coalesce((SELECT pg_catalog.string_agg(pg_catalog.format('%s (enabled %s)', pg_catalog.pg_get_triggerdef(t.oid), t.tgenabled), '; ')
                   FROM pg_catalog.pg_trigger t
                  WHERE t.tgrelid = c.oid AND NOT t.tgisinternal), 'no trigger'),
       'the table''s owner or a superuser removed or disabled it, and could change rows unseen by it'
  FROM want_trg w
  JOIN pg_catalog.pg_class c ON c.relname = w.tbl AND c.relnamespace = (SELECT oid FROM ns)
 WHERE NOT EXISTS (
       SELECT 1 FROM pg_catalog.pg_trigger t
         JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
        WHERE t.tgrelid = c.oid AND p.proname = w.fn AND p.pronamespace = (SELECT oid FROM ns)
          AND t.tgtype & (w.tgtype | 1) = w.tgtype AND t.tgenabled IN ('O', 'A')
          AND t.tgqual IS NULL AND pg_catalog.cardinality(t.tgattr::pg_catalog.int2[]) = 0)
UNION ALL
SELECT w.tbl,
       pg_catalog.format('no valid unique index on (%s) without a predicate', pg_catalog.array_to_string(w.cols, ', ')),
       coalesce((SELECT pg_catalog.string_agg(pg_catalog.pg_get_indexdef(i.indexrelid)
                                              || CASE WHEN i.indisvalid THEN '' ELSE ' (invalid)' END, '; ')
                   FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisunique), 'no unique index'),
       'the table''s owner or a superuser removed or disabled it, and could change rows unseen by it'
  FROM want_idx w
  JOIN pg_catalog.pg_class c ON c.relname = w.tbl AND c.relnamespace = (SELECT oid FROM ns)
 WHERE NOT EXISTS (
       SELECT 1 FROM pg_catalog.pg_index i
        WHERE i.indrelid = c.oid AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL
          AND ARRAY(SELECT a.attname::text
                      FROM pg_catalog.unnest(i.indkey::int2[]) WITH ORDINALITY k(att, ord)
                      JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.att
                     WHERE k.ord <= i.indnkeyatts
                     ORDER BY a.attname) = w.cols)
UNION ALL
SELECT c.relname::text,
       'row-level security is enabled' || CASE WHEN c.relforcerowsecurity THEN ' and forced (its owner is filtered too)' ELSE '' END,
       coalesce((SELECT pg_catalog.string_agg(pg_catalog.format('policy %I for %s to %s using (%s)', p.polname,
                                                                 CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE'
                                                                               WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
                                                                 CASE WHEN p.polroles = '{0}' THEN 'PUBLIC'
                                                                      ELSE (SELECT pg_catalog.string_agg(pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(r.oid)), ', ')
                                                                              FROM pg_catalog.unnest(p.polroles) r(oid)) END,
                                                                 coalesce(pg_catalog.pg_get_expr(p.polqual, p.polrelid), 'true')), '; ')
                   FROM pg_catalog.pg_policy p WHERE p.polrelid = c.oid), 'no policy: every row hidden from all but its owner'),
       'the table''s owner or a superuser enabled it: its policies can hide rows from some roles (this one among them) and show others a different log, unseen by this run'
  FROM pg_catalog.pg_class c
 WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relrowsecurity
   AND c.relname IN ('events', 'events_archive', 'streams', 'scavenge_runs', 'schema_migrations')
UNION ALL
SELECT c.relname::text,
       pg_catalog.format('the trigger %I is not one of annals''s', t.tgname),
       pg_catalog.format('%s (enabled %s)', pg_catalog.pg_get_triggerdef(t.oid), t.tgenabled),
       'the table''s owner or a superuser created it: it runs their code at each write of the table, and before a row is written can change it'
  FROM pg_catalog.pg_trigger t
  JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = (SELECT oid FROM ns) AND NOT t.tgisinternal
   AND c.relname IN ('events', 'events_archive', 'streams')
   AND (c.relname::text, t.tgname::text) NOT IN (('events', 'events_append_only'), ('events_archive', 'events_archive_guard'))
UNION ALL
SELECT c.relname::text,
       pg_catalog.format('the rule %I is not one of annals''s', r.rulename),
       pg_catalog.regexp_replace(pg_catalog.pg_get_ruledef(r.oid), '\s+', ' ', 'g'),
       'the table''s owner or a superuser created it: it rewrites or adds to the statements that write the table'
  FROM pg_catalog.pg_rewrite r
  JOIN pg_catalog.pg_class c ON c.oid = r.ev_class
 WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relname IN ('events', 'events_archive', 'streams')
UNION ALL
SELECT c.relname::text,
       pg_catalog.format('the table %s inherits from it', i.inhrelid::regclass),
       'a table of its own',
       'the table''s owner or a superuser created it: its rows read as this table''s, and none of this table''s triggers or unique indexes guards them'
  FROM pg_catalog.pg_inherits i
  JOIN pg_catalog.pg_class c ON c.oid = i.inhparent
 WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relname IN ('events', 'events_archive', 'streams')
 ORDER BY 1, 2;

-- name: CanReadScavengeRuns
SELECT coalesce((SELECT pg_catalog.has_table_privilege(c.oid, 'SELECT')
                   FROM pg_catalog.pg_class c
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = {{.SchemaLiteral}} AND c.relname = 'scavenge_runs'), false);

-- name: ScavengeRuns
-- The scavenge runs that removed events (only scavenge() removes events
-- from the log): the range of positions (from_position, scanned_to] it
-- scanned, the head when it started (target_position: what its first step
-- could see), when it started and when its last step so far ended, and its
-- retention clock.
SELECT id, started_by, from_position, scanned_to, target_position, removed,
       started_at, coalesce(finished_at, updated_at), now_at
  FROM {{.Schema}}.scavenge_runs
 WHERE removed > 0
 ORDER BY id;

-- name: UnrecordedRetention
-- Streams whose max_count or max_age is not what the latest
-- "$stream.truncated" event of their metadata stream ("$$" and the ID)
-- records: set_stream_retention changes the row and appends that event in
-- one transaction. Returns the setting and the record (NULL: none). $1 is
-- where set_stream_retention's records may be older than migration 0038
-- (deletions_recorded_after(), or below the first deletion record: a call
-- that started before 0038 committed ran the old function): a record at or
-- below it was written as
-- float8 text, which followed the session's extra_float_digits (0 rounds to
-- 15 significant digits, a relative error below 1e-14); later records are
-- exact. The
-- scavenger removes a stream's oldest versions first, so a record that is
-- kept is the latest one whatever the metadata stream's own retention.
-- Only when none is kept and the metadata stream has retention of its own,
-- or was truncated or deleted (possible before migrations 0021 and 0024),
-- may the record have been lost legitimately: the stream is then not
-- checked (Lifecycle notes it).
SELECT s.stream_id,
       format('max_count %s, max_age %s', coalesce(s.max_count::text, 'none'), coalesce(s.max_age::text, 'none')),
       t.data::text
  FROM {{.Schema}}.streams s
  LEFT JOIN LATERAL (
       SELECT e.data, e.global_sequence
         FROM {{.WholeLog}} e
        WHERE e.stream_id = '$$' || s.stream_id AND e.event_type = '$stream.truncated'
        ORDER BY e.stream_version DESC
        LIMIT 1) t ON true
 WHERE (s.max_count IS NOT NULL OR s.max_age IS NOT NULL)
   AND (t.data IS NULL
        OR (t.data->>'max_count')::bigint IS DISTINCT FROM s.max_count
        OR (t.data->>'max_age_seconds' IS NULL) <> (s.max_age IS NULL)
        OR abs((t.data->>'max_age_seconds')::float8 - extract(epoch FROM s.max_age)::float8)
           > CASE WHEN t.global_sequence <= $1 THEN 1e-14 * extract(epoch FROM s.max_age)::float8 ELSE 0 END)
   AND NOT (t.data IS NULL AND EXISTS (
       SELECT 1 FROM {{.Schema}}.streams m
        WHERE m.stream_id = '$$' || s.stream_id
          AND (m.state <> 0 OR m.truncate_before > 1 OR m.max_count IS NOT NULL OR m.max_age IS NOT NULL)))
 ORDER BY s.stream_id;

-- name: SamePosition
-- Positions held by a row of events and one of events_archive.
SELECT e.global_sequence, e.stream_id, a.stream_id
  FROM {{.Schema}}.events e
  JOIN {{.Schema}}.events_archive a ON a.global_sequence = e.global_sequence
 ORDER BY e.global_sequence;

-- name: Events
-- $1 after (exclusive), $2 limit. data and metadata as stored (json keeps
-- the bytes as written).
SELECT global_sequence, event_id, stream_id, stream_version, event_type,
       data::text, metadata::text, recorded_at
  FROM {{.WholeLog}} e
 WHERE global_sequence > $1
 ORDER BY global_sequence
 LIMIT $2;

-- name: Streams
-- $1 after (exclusive; '' first), $2 limit.
SELECT stream_id, version
  FROM {{.Schema}}.streams
 WHERE stream_id > $1
 ORDER BY stream_id
 LIMIT $2;

-- name: ServerMajor
-- The server's major version (15 for 15.x).
SELECT pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog./) 10000;

-- name: SchemaVersion
-- The newest migration applied.
SELECT coalesce(max(version), 0) FROM {{.Schema}}.schema_migrations;

-- name: PinSearchPath
-- For the rest of the transaction: pg_get_functiondef then qualifies every
-- name outside pg_catalog, whatever the session's search_path.
SET LOCAL search_path = pg_catalog, pg_temp;

-- name: SchemaOnSearchPath
-- While the functions are read (PinSearchPath follows): the schema after
-- pg_catalog, so that pg_get_functiondef names the schema's objects
-- without it (it names what the path shows bare), whatever the schema's
-- name; only its header names the schema.
SET LOCAL search_path = pg_catalog, {{.Schema}}, pg_temp;

-- name: Functions
-- The schema's functions: name, identity arguments, body (a function with
-- an SQL-standard body, PostgreSQL 14 on, has an empty prosrc: its whole
-- definition then), whether each runs as its owner, its settings, and the
-- schema's name as PostgreSQL writes it (quote_ident: bare when plain),
-- whether it is strict, its volatility, and its number of input arguments,
-- of those with defaults, and whether it is variadic.
-- Every operator is pg_catalog's by name: the schema is on the search_path
-- (SchemaOnSearchPath), and its owner may have made operators there.
SELECT p.proname::text,
       pg_catalog.pg_get_function_identity_arguments(p.oid),
       p.prosrc,
       CASE WHEN p.prosrc OPERATOR(pg_catalog.=) ''::pg_catalog.text THEN pg_catalog.pg_get_functiondef(p.oid) END,
       p.prosecdef, p.proconfig,
       pg_catalog.quote_ident(n.nspname::pg_catalog.text),
       p.proisstrict,
       CASE p.provolatile WHEN 'i' THEN 'immutable' WHEN 's' THEN 'stable' ELSE 'volatile' END,
       p.pronargs::pg_catalog.int4, p.pronargdefaults::pg_catalog.int4,
       p.provariadic OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
 WHERE n.nspname OPERATOR(pg_catalog.=) {{.SchemaLiteral}}::pg_catalog.name;
