-- The privileges `annals grant` (migrations.Grant) gives a role, in groups.
-- A kind of role is a list of groups (see grant.go):
--
--   reader:   schema, read, observe
--   writer:   schema, read, append, snapshots
--   runner:   schema, read, observe, append, run, locks
--   operator: schema, read, observe, append, run, operate, locks
--
-- {{.Schema}} is the schema and {{.Role}} the role, both quoted identifiers.
-- One statement per line. The group role_exists is Grant's own check, not
-- a privilege. Nothing here grants INSERT, UPDATE, DELETE or
-- TRUNCATE on events or streams: the log is written only through the
-- functions of the append group, which run as the schema's owner.

-- name: schema
GRANT USAGE ON SCHEMA {{.Schema}} TO {{.Role}};
-- Which migrations are applied: lets any role check the schema's version.
GRANT SELECT ON {{.Schema}}.schema_migrations TO {{.Role}};

-- name: read
-- Read the log (eventstore Read*, catch-up reads, aggregate loads).
GRANT SELECT ON {{.Schema}}.events, {{.Schema}}.streams TO {{.Role}};
-- Archived events (annals archive) and the view of the whole log that reads
-- reaching below the archive horizon use.
GRANT SELECT ON {{.Schema}}.events_archive, {{.Schema}}.events_all TO {{.Role}};
-- The catch-up engine's read (catchup ReadBatch, also in annals tail) looks
-- at the subscriber's checkpoint and dead letters in the same statement.
GRANT SELECT ON {{.Schema}}.checkpoints, {{.Schema}}.dead_letters TO {{.Role}};
-- Await (read-your-writes) finds the awaited event's partition by the
-- subscriber's recorded layout, and a blue/green projection's live
-- generation: without these a writer's Await waits for every partition.
GRANT SELECT ON {{.Schema}}.subscriber_layouts, {{.Schema}}.read_model_generations TO {{.Role}};
-- Reads of events with personal data look up whether the subject is forgotten
-- (and its wrapped data key, useless without the application's KEK).
GRANT SELECT ON {{.Schema}}.personal_keys TO {{.Role}};

-- name: observe
-- A reader's view of the machinery, for annals status and the console's
-- pages (overview, subscriber, scheduler, instances): who runs, what is
-- failing, what is due. Reading only; runners and operators get it too (run
-- grants more on most of these tables, but not audit_log), writers do not
-- need it.
GRANT SELECT ON {{.Schema}}.instances, {{.Schema}}.failures, {{.Schema}}.timers, {{.Schema}}.cron_tasks TO {{.Role}};
-- A task's newest fired tick, which its next tick is computed from when a
-- dispatcher's clock ran ahead (scheduler Tasks).
GRANT SELECT ON {{.Schema}}.cron_ticks TO {{.Role}};
-- The console's audit page: who did what through it.
GRANT SELECT ON {{.Schema}}.audit_log TO {{.Role}};

-- name: append
-- Every function that appends to the log, one line each.
GRANT EXECUTE ON FUNCTION {{.Schema}}.append_events(text, bigint, jsonb) TO {{.Role}};
GRANT EXECUTE ON FUNCTION {{.Schema}}.append_events_json(text, bigint, json) TO {{.Role}};
GRANT EXECUTE ON FUNCTION {{.Schema}}.append_batch(text[], bigint[], int[], int[], uuid[], text[], text[], text[], boolean) TO {{.Role}};
GRANT EXECUTE ON FUNCTION {{.Schema}}.append_one(text, bigint, uuid, text, text, text, boolean) TO {{.Role}};
-- eventstore DeleteStream (annals stream delete): appends a "$stream.deleted" event.
GRANT EXECUTE ON FUNCTION {{.Schema}}.delete_stream(text, bigint, boolean, jsonb) TO {{.Role}};
-- eventstore SetStreamRetention (annals stream set): appends "$stream.truncated".
GRANT EXECUTE ON FUNCTION {{.Schema}}.set_stream_retention(text, interval, bigint, bigint) TO {{.Role}};
-- eventstore personal data: a subject's first append creates its data key
-- (CreateKey inserts these two columns only); Store.Forget (annals forget)
-- destroys it through forget_subject. INSERT on the two columns only:
-- created_at takes its default and forgotten_at stays NULL, so a writer
-- cannot plant a (backdated) erasure record forget_subject never wrote.
GRANT INSERT (subject, wrapped_key) ON {{.Schema}}.personal_keys TO {{.Role}};
GRANT EXECUTE ON FUNCTION {{.Schema}}.forget_subject(text) TO {{.Role}};
-- eventstore inline projections: the retry lock of inline appends to one
-- stream (a transaction lock on that key only).
GRANT EXECUTE ON FUNCTION {{.Schema}}.inline_stream_lock(text) TO {{.Role}};

-- name: snapshots
-- aggregate: LoadSnapshot, SaveSnapshot (an upsert).
GRANT SELECT, INSERT, UPDATE ON {{.Schema}}.snapshots TO {{.Role}};
-- aggregate SaveSnapshot: the shared side of Forget's lock (a transaction
-- lock on that key only).
GRANT EXECUTE ON FUNCTION {{.Schema}}.snapshot_lock() TO {{.Role}};

-- name: run
-- checkpoint: Claim, Load, Commit; projection: Stop, FOR SHARE in RecordFailure.
GRANT SELECT, INSERT, UPDATE ON {{.Schema}}.checkpoints TO {{.Role}};
-- catchup: RecordLayout, the subscriber's partition layout, recorded at its
-- first run (replaced while none of its checkpoints moved past 0).
GRANT SELECT, INSERT, UPDATE ON {{.Schema}}.subscriber_layouts TO {{.Role}};
-- relay: what its JetStream stream had acknowledged at each checkpoint commit
-- (an upsert), read at each leadership's start.
GRANT SELECT, INSERT, UPDATE ON {{.Schema}}.relay_acks TO {{.Role}};
-- projection: Register, Heartbeat, Deregister (and expiry of dead instances).
GRANT SELECT, INSERT, UPDATE, DELETE ON {{.Schema}}.instances TO {{.Role}};
-- projection: RecordFailure, RetryAt, ForgetFailures (also on rebuild).
GRANT SELECT, INSERT, UPDATE, DELETE ON {{.Schema}}.failures TO {{.Role}};
GRANT USAGE ON SEQUENCE {{.Schema}}.failures_id_seq TO {{.Role}};
-- projection: DeadLetter (an upsert), ParkedStreams, Released, Resolve, Reopen,
-- and SupersedeDeadLetters on rebuild.
GRANT SELECT, INSERT, UPDATE ON {{.Schema}}.dead_letters TO {{.Role}};
GRANT USAGE ON SEQUENCE {{.Schema}}.dead_letters_id_seq TO {{.Role}};
-- scheduler: InsertTimer, ClaimDue, ClaimTimer, FailTimer, Cancel*.
GRANT SELECT, INSERT, UPDATE, DELETE ON {{.Schema}}.timers TO {{.Role}};
-- scheduler: UpsertTask (AddTask), LockTask, RecordTick, SkipTick, Pause/ResumeTask.
GRANT SELECT, INSERT, UPDATE ON {{.Schema}}.cron_tasks TO {{.Role}};
-- scheduler: RecordTick, PruneTicks.
GRANT SELECT, INSERT, DELETE ON {{.Schema}}.cron_ticks TO {{.Role}};
-- saga: Load, Insert, Update, Prune.
GRANT SELECT, INSERT, UPDATE, DELETE ON {{.Schema}}.saga_states TO {{.Role}};
-- projection: read-model setup (SetupVersion, RecordSetup), also on rebuild.
GRANT SELECT, INSERT, UPDATE ON {{.Schema}}.read_model_setups TO {{.Role}};
-- projection: blue/green read models (generations, cut-over, rollback, janitor).
-- Creating a generation's schema also needs CREATE on the database, and the
-- views need CREATE on the reader schema: grant those yourself.
GRANT SELECT, INSERT, UPDATE ON {{.Schema}}.read_model_generations TO {{.Role}};
GRANT EXECUTE ON FUNCTION {{.Schema}}.read_model_create_schema(text, integer) TO {{.Role}};
GRANT EXECUTE ON FUNCTION {{.Schema}}.read_model_drop_schema(text, integer) TO {{.Role}};
GRANT EXECUTE ON FUNCTION {{.Schema}}.read_model_swap_views(text, text, text) TO {{.Role}};

-- name: operate
-- annals dlq purge; annals schedule delete.
GRANT DELETE ON {{.Schema}}.dead_letters, {{.Schema}}.cron_tasks TO {{.Role}};
-- annals verify compares the log's head with the position sequence (reading
-- it draws no number). No SELECT on snapshots: they hold aggregates' state
-- decrypted, personal fields in clear, and no operator command reads them.
GRANT SELECT ON SEQUENCE {{.Schema}}.events_global_sequence TO {{.Role}};
-- annals scavenge (package scavenge): removes expired events, recording each run.
GRANT EXECUTE ON FUNCTION {{.Schema}}.scavenge(text, timestamptz, int) TO {{.Role}};
GRANT SELECT ON {{.Schema}}.scavenge_runs TO {{.Role}};
-- annals archive (package archive): moves old events to events_archive,
-- recording each run.
GRANT EXECUTE ON FUNCTION {{.Schema}}.archive(text, bigint, int) TO {{.Role}};
GRANT SELECT ON {{.Schema}}.archive_runs TO {{.Role}};
-- The operator console (package console) and the CLI's operator actions (annals
-- dlq retry|skip|purge, checkpoint set, schedule pause|resume|delete|cancel)
-- record each action in audit_log (the console lists it); a trigger stamps
-- the ID, time and role.
GRANT SELECT, INSERT ON {{.Schema}}.audit_log TO {{.Role}};
GRANT USAGE ON SEQUENCE {{.Schema}}.audit_log_id_seq TO {{.Role}};

-- name: locks
-- PostgreSQL's advisory-lock functions the runner's statements call: the
-- leader elections (advisorylock: the catch-up engine, the scheduler, the
-- relay, archive, scavenge, rebuilds) take session locks, a batch's commit
-- a shared try-lock (the fence), read-model setup a transaction lock. They
-- matter once `annals advisory-locks restrict` took them from PUBLIC. Grant
-- runs this group as a superuser only (no other role has the grant option
-- on PostgreSQL's functions). Writers need none: the two locks their own
-- statements take go through the schema's snapshot_lock and
-- inline_stream_lock (0034).
GRANT EXECUTE ON FUNCTION pg_catalog.pg_try_advisory_lock(integer, integer) TO {{.Role}};
GRANT EXECUTE ON FUNCTION pg_catalog.pg_advisory_lock(integer, integer) TO {{.Role}};
GRANT EXECUTE ON FUNCTION pg_catalog.pg_try_advisory_xact_lock_shared(integer, integer) TO {{.Role}};
GRANT EXECUTE ON FUNCTION pg_catalog.pg_advisory_xact_lock(integer, integer) TO {{.Role}};

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1);

