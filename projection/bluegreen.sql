-- Statements of blue/green read models (bluegreen.go).

-- name: GenLock
-- Serializes changes to one projection's generations (creation, cut-over,
-- rollback, drop) across every process, until the transaction ends.
-- $1, $2: lockkey.Pair(schema + ":generations:" + name).
SELECT pg_catalog.pg_advisory_xact_lock($1::int4, $2::int4);

-- name: Generations
-- With each generation's unresolved dead letters (open, or released for
-- re-delivery): a building generation is not cut over while it has any.
-- The first time it went live (first_live_since, migration 0039, set once
-- a rollback made it live again; else live_since), then the last time.
SELECT g.generation, g.version, g.schema_name, g.reader_schema, g.subscriber, g.state, g.created_by, g.created_at,
       coalesce(g.first_live_since, g.live_since), g.live_since, g.retired_at, g.dropped_at, g.cutover_ms, g.cutover_position, g.replaced,
       (SELECT count(*)::int FROM {{.Schema}}.dead_letters d
         WHERE d.subscriber_id = g.subscriber AND d.status IN ('open', 'retry'))
  FROM {{.Schema}}.read_model_generations g
 WHERE g.projection = $1
 ORDER BY g.generation;

-- name: Unresolved
-- The unresolved dead letters of a generation's subscriber $1 (open, or
-- released for re-delivery and not yet re-delivered): how many, how many of
-- them are released, and the position of the first.
SELECT count(*)::int, (count(*) FILTER (WHERE status = 'retry'))::int, coalesce(min(global_sequence), 0)
  FROM {{.Schema}}.dead_letters
 WHERE subscriber_id = $1 AND status IN ('open', 'retry');

-- name: NextGeneration
SELECT coalesce(max(generation), 0) + 1 FROM {{.Schema}}.read_model_generations WHERE projection = $1;

-- name: InsertGeneration
-- $1 projection, $2 generation, $3 version, $4 schema, $5 reader schema,
-- $6 subscriber, $7 state (building or live), $8 created by.
INSERT INTO {{.Schema}}.read_model_generations
       (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by, live_since)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, CASE WHEN $7 = 'live' THEN clock_timestamp() END);

-- name: SchemaExists
-- Whether schema $1 exists: a new generation takes its unscoped name
-- unless another annals schema (or anything else) has it.
SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1);

-- name: CreateSchema
SELECT {{.Schema}}.read_model_create_schema($1, $2);

-- name: DropSchema
SELECT {{.Schema}}.read_model_drop_schema($1, $2);

-- name: SwapViews
-- $1 reader schema, $2 the schema the views point at now (NULL: none), $3 the new one.
SELECT {{.Schema}}.read_model_swap_views($1, $2, $3);

-- name: SearchPath
-- Makes unqualified names resolve in a generation's schema first, for the
-- rest of the transaction; the session's search_path follows.
SELECT pg_catalog.set_config('search_path',
       pg_catalog.quote_ident($1) || ', ' || pg_catalog.current_setting('search_path'), true);

-- name: ReaderViews
-- How many views of reader schema $1 read a relation of the same name in
-- schema $2 or $3 (generations' schemas): the views read_model_swap_views
-- made. A rollback swaps views only in a reader schema that holds some.
SELECT count(DISTINCT v.oid)
  FROM pg_catalog.pg_class v
  JOIN pg_catalog.pg_namespace vn ON vn.oid = v.relnamespace
  JOIN pg_catalog.pg_rewrite rw ON rw.ev_class = v.oid
  JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::pg_catalog.regclass AND d.objid = rw.oid
   AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
  JOIN pg_catalog.pg_class t ON t.oid = d.refobjid
  JOIN pg_catalog.pg_namespace tn ON tn.oid = t.relnamespace
 WHERE vn.nspname = $1 AND v.relkind = 'v' AND tn.nspname IN ($2, $3) AND t.relname = v.relname;

-- name: Relations
-- The relations of a generation's schema that readers see through views.
SELECT count(*)
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f');

-- name: LockTimeout
SELECT pg_catalog.set_config('lock_timeout', $1, true);

-- name: LockCheckpoints
-- A generation's checkpoint rows, locked until the transaction ends: a
-- leader's batch in flight commits first (its checkpoint update holds the
-- row), and the next one waits for the cut-over's commit.
SELECT partition, position
  FROM {{.Schema}}.checkpoints
 WHERE subscriber_id = $1
 ORDER BY partition
   FOR UPDATE;

-- name: Positions
SELECT partition, position FROM {{.Schema}}.checkpoints WHERE subscriber_id = $1 ORDER BY partition;

-- name: RetireCheckpoints
-- Stops a generation that readers no longer see exactly where it is: the
-- epoch bump fences the leader (its next commit fails), the stop reason
-- keeps any leader from processing more. Each fence is announced
-- (checkpoint.FenceChannel, delivered at commit), so that an idle leader
-- lets go at once.
UPDATE {{.Schema}}.checkpoints
   SET epoch = epoch + 1, owner = NULL, stopped_reason = $2, stopped_at = clock_timestamp(),
       updated_at = clock_timestamp()
 WHERE subscriber_id = $1
RETURNING {{.AnnounceFence "subscriber_id" "partition"}};

-- name: ReviveCheckpoints
UPDATE {{.Schema}}.checkpoints
   SET stopped_reason = NULL, stopped_at = NULL, updated_at = clock_timestamp()
 WHERE subscriber_id = $1;

-- name: MarkLive
-- A cut-over. $1 projection, $2 generation, $3 cut-over milliseconds, $4
-- position, $5 the generation that was live until now (NULL: none), which
-- Rollback goes back to.
UPDATE {{.Schema}}.read_model_generations
   SET state = 'live', live_since = clock_timestamp(), retired_at = NULL, cutover_ms = $3, cutover_position = $4,
       replaced = $5::int
 WHERE projection = $1 AND generation = $2;

-- name: MarkLiveAgain
-- A rollback: as MarkLive, but the generation keeps the one it replaced
-- when it was first cut over, so that the next rollback goes further back
-- and not forward to the generation rolled back from, and the time it first
-- went live, in first_live_since (set by its first rollback, from
-- live_since, which each sets to now).
UPDATE {{.Schema}}.read_model_generations
   SET state = 'live', first_live_since = coalesce(first_live_since, live_since), live_since = clock_timestamp(),
       retired_at = NULL, cutover_ms = $3, cutover_position = $4
 WHERE projection = $1 AND generation = $2;

-- name: MarkRetired
UPDATE {{.Schema}}.read_model_generations
   SET state = 'retired', retired_at = clock_timestamp()
 WHERE projection = $1 AND generation = $2;

-- name: MarkDropped
UPDATE {{.Schema}}.read_model_generations
   SET state = 'dropped', dropped_at = clock_timestamp()
 WHERE projection = $1 AND generation = $2 AND state = 'retired';

-- name: Expired
-- Retired generations whose retention ($2 microseconds) has passed, and
-- the schema each row names. Locked: DropRetired checks the name and then
-- read_model_drop_schema reads the row again, in the same transaction, and
-- another runner role (every one may write the table) must not change the
-- name in between.
SELECT generation, schema_name
  FROM {{.Schema}}.read_model_generations
 WHERE projection = $1 AND state = 'retired'
   AND retired_at < clock_timestamp() - $2::bigint * interval '1 microsecond'
 ORDER BY generation
   FOR UPDATE;

-- name: Dependents
-- How many objects outside schema $1 depend on something in it (a normal
-- dependency, pg_depend): the reader schema's views of a generation's
-- tables (their rewrite rules), a view, foreign key, trigger, default,
-- policy, function or type of another schema. DropRetired drops a schema
-- only when there are none: DROP SCHEMA ... CASCADE would take them along,
-- and a generation readers still read is not retired, whatever its row says
-- (any runner role may write read_model_generations; none can make or drop
-- another role's views). What depends on an object of the schema is
-- placed by the schema of the relation, function or type it belongs to.
WITH s AS (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = $1),
inside AS (
    SELECT 'pg_catalog.pg_class'::pg_catalog.regclass AS classid, c.oid FROM pg_catalog.pg_class c, s WHERE c.relnamespace = s.oid
    UNION ALL
    SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid FROM pg_catalog.pg_type t, s WHERE t.typnamespace = s.oid
    UNION ALL
    SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid FROM pg_catalog.pg_proc p, s WHERE p.pronamespace = s.oid
)
SELECT count(*)::int
  FROM pg_catalog.pg_depend d
  JOIN inside i ON i.classid = d.refclassid AND i.oid = d.refobjid
 WHERE d.deptype = 'n'
   AND CASE d.classid
         WHEN 'pg_catalog.pg_rewrite'::pg_catalog.regclass THEN
           (SELECT c.relnamespace FROM pg_catalog.pg_rewrite r JOIN pg_catalog.pg_class c ON c.oid = r.ev_class WHERE r.oid = d.objid)
         WHEN 'pg_catalog.pg_class'::pg_catalog.regclass THEN
           (SELECT c.relnamespace FROM pg_catalog.pg_class c WHERE c.oid = d.objid)
         WHEN 'pg_catalog.pg_constraint'::pg_catalog.regclass THEN
           (SELECT coalesce(c.relnamespace, k.connamespace) FROM pg_catalog.pg_constraint k
              LEFT JOIN pg_catalog.pg_class c ON c.oid = k.conrelid WHERE k.oid = d.objid)
         WHEN 'pg_catalog.pg_trigger'::pg_catalog.regclass THEN
           (SELECT c.relnamespace FROM pg_catalog.pg_trigger tg JOIN pg_catalog.pg_class c ON c.oid = tg.tgrelid WHERE tg.oid = d.objid)
         WHEN 'pg_catalog.pg_attrdef'::pg_catalog.regclass THEN
           (SELECT c.relnamespace FROM pg_catalog.pg_attrdef ad JOIN pg_catalog.pg_class c ON c.oid = ad.adrelid WHERE ad.oid = d.objid)
         WHEN 'pg_catalog.pg_policy'::pg_catalog.regclass THEN
           (SELECT c.relnamespace FROM pg_catalog.pg_policy po JOIN pg_catalog.pg_class c ON c.oid = po.polrelid WHERE po.oid = d.objid)
         WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass THEN
           (SELECT p.pronamespace FROM pg_catalog.pg_proc p WHERE p.oid = d.objid)
         WHEN 'pg_catalog.pg_type'::pg_catalog.regclass THEN
           (SELECT t.typnamespace FROM pg_catalog.pg_type t WHERE t.oid = d.objid)
       END IS DISTINCT FROM (SELECT s.oid FROM s)
   AND d.classid IN ('pg_catalog.pg_rewrite'::pg_catalog.regclass, 'pg_catalog.pg_class'::pg_catalog.regclass,
                     'pg_catalog.pg_constraint'::pg_catalog.regclass, 'pg_catalog.pg_trigger'::pg_catalog.regclass,
                     'pg_catalog.pg_attrdef'::pg_catalog.regclass, 'pg_catalog.pg_policy'::pg_catalog.regclass,
                     'pg_catalog.pg_proc'::pg_catalog.regclass, 'pg_catalog.pg_type'::pg_catalog.regclass);

-- name: SchemaOwner
-- The owner of schema $1 (no row: there is none), and whether this role may
-- trust it as a generation's: it owns it or is a member of the role that
-- does (by membership: being a superuser does not count), or a superuser
-- owns it. Another role's schema is not: any runner role may write
-- read_model_generations and has CREATE on the database, so it could make
-- the schema annals names a generation before this runner does, and the
-- handlers would write, and readers read, what that role owns (it may read
-- and change all of it). read_model_create_schema runs with the caller's
-- rights: the schema it makes is the caller's.
WITH RECURSIVE m(oid) AS (
    SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user
    UNION
    SELECT a.roleid FROM pg_catalog.pg_auth_members a JOIN m ON a.member = m.oid
)
SELECT pg_catalog.pg_get_userbyid(n.nspowner)::text, n.nspowner IN (SELECT m.oid FROM m) OR o.rolsuper
  FROM pg_catalog.pg_namespace n
  JOIN pg_catalog.pg_roles o ON o.oid = n.nspowner
 WHERE n.nspname = $1;

-- name: GenerationWriters
-- The roles that may insert or update read_model_generations of schema $1
-- (its owner and the grantees; members of those roles and superusers may
-- too): who could have written a row a runner refuses.
SELECT coalesce(string_agg(DISTINCT w.name, ', ' ORDER BY w.name), '')
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  CROSS JOIN LATERAL (
      SELECT pg_catalog.pg_get_userbyid(c.relowner)::text
      UNION ALL
      SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.pg_get_userbyid(a.grantee)::text END
        FROM pg_catalog.aclexplode(c.relacl) a
       WHERE a.privilege_type IN ('INSERT', 'UPDATE')
  ) w(name)
 WHERE n.nspname = $1 AND c.relname = 'read_model_generations';
