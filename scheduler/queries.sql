-- Statements of the scheduler package, rendered with the schema as
-- {{.Schema}}. Times compared with due_at and ticks are always parameters
-- taken from the scheduler's Clock, never the database's now().

-- name: InsertTimer
-- One statement: the insert and the wake-up NOTIFY ($6 is the channel), which
-- PostgreSQL sends when the surrounding transaction commits. The payload goes
-- to payload_json, kept byte for byte (migration 0033).
WITH ins AS (
    INSERT INTO {{.Schema}}.timers (id, due_at, stream_id, payload_json, owner)
    VALUES ($1, $2, $3, $4, $5)
    RETURNING id
)
SELECT pg_notify($6, $7) FROM ins;

-- name: JsonbStorable
-- Whether jsonb holds the JSON text $1 (migration 0032's function: it
-- answers false rather than raising, so the caller's transaction goes on).
SELECT {{.Schema}}.jsonb_storable($1);

-- name: BoundClaim
-- The first statement of every claim's transaction, sent in one round trip
-- with the claim itself: a dispatcher that hangs while its transaction holds
-- claimed rows (or a task's row) loses its session after $1 idle, so its
-- rows go back to the other dispatchers. No lock_timeout and no
-- statement_timeout, whatever the role or the database sets: an append
-- that waits for the log's lock behind a long transaction would then fail,
-- and count as a failed attempt of its timers (after MaxAttempts a valid
-- timer would never fire). $1: the timeout in milliseconds, as text. Local
-- to the transaction.
SELECT set_config('idle_in_transaction_session_timeout', $1::text, true),
       set_config('lock_timeout', '0', true),
       set_config('statement_timeout', '0', true);

-- name: ClaimDue
-- Claims and deletes up to $2 due timers in one statement. Rows another
-- dispatcher holds are skipped, not waited for; the deletes only become
-- visible if the claiming transaction (which then appends) commits.
-- RETURNING does not keep the subquery's order: the client sorts the claim
-- by due_at, id before appending. The payload is payload_json, as written,
-- or for a timer stored before migration 0033 its jsonb payload.
DELETE FROM {{.Schema}}.timers t
 WHERE t.id IN (SELECT id FROM {{.Schema}}.timers
                 WHERE failed_at IS NULL AND due_at <= $1
                 ORDER BY due_at, id
                 LIMIT $2
                   FOR UPDATE SKIP LOCKED)
RETURNING t.id, coalesce(t.payload_json::text, t.payload::text), t.attempts, t.lost_races, t.due_at;

-- name: ClaimTimer
-- The slow path after a failed batch: claim one timer (if still due and not
-- held by anyone else) in a transaction of its own.
DELETE FROM {{.Schema}}.timers t
 WHERE t.id IN (SELECT id FROM {{.Schema}}.timers
                 WHERE id = $1 AND failed_at IS NULL AND due_at <= $2
                   FOR UPDATE SKIP LOCKED)
RETURNING t.id, coalesce(t.payload_json::text, t.payload::text), t.attempts, t.lost_races, t.due_at;

-- name: FailTimer
-- Records a failed attempt: $3 the new due time (retry) or $4 the time it
-- failed for good (attempts spent), the other NULL. $5 and $8 are the
-- attempts and lost_races the attempt saw: if the row changed since
-- (another dispatcher recorded a failure), nothing is updated. $6 is 1, or
-- 0 for a failure that is not counted as an attempt (a serialization
-- failure, a deadlock); $7 the new lost_races.
UPDATE {{.Schema}}.timers
   SET attempts = attempts + $6::integer,
       lost_races = $7,
       last_error = $2,
       due_at = coalesce($3, due_at),
       failed_at = $4,
       updated_at = clock_timestamp()
 WHERE id = $1 AND attempts = $5 AND lost_races = $8 AND failed_at IS NULL;

-- name: BoundCancel
-- Sent with a cancellation, in its transaction or savepoint: it waits for a
-- row lock (a dispatcher firing the timer) at most $1 ms (as text). The
-- caller's lock_timeout is kept in annals.saved_lock_timeout and put back
-- by UnboundCancel, so that a caller's transaction goes on with its own.
SELECT set_config('annals.saved_lock_timeout', current_setting('lock_timeout'), true),
       set_config('lock_timeout', $1::text, true);

-- name: UnboundCancel
SELECT set_config('lock_timeout', current_setting('annals.saved_lock_timeout'), true);

-- name: CancelTimer
-- Waits for a dispatcher that holds the row (it is firing the timer): if
-- its claim commits, the row is gone and nothing is deleted (the timer
-- fired); if it rolls back (the append failed), the row is deleted here,
-- before the dispatcher can take it again or record the failure.
DELETE FROM {{.Schema}}.timers WHERE id = $1;

-- name: CancelOwned
-- Waits for held rows as CancelTimer does.
DELETE FROM {{.Schema}}.timers WHERE owner = $1;

-- name: NextDue
-- The earliest due time of a timer that may still fire.
SELECT min(due_at) FROM {{.Schema}}.timers WHERE failed_at IS NULL;

-- name: ListTimers
-- Failed timers first (they need an operator), then pending ones by due time.
-- The payload is payload_json, or payload for a timer stored before 0033.
SELECT id, due_at, stream_id, owner, attempts, coalesce(last_error, ''), failed_at, created_at,
       coalesce((payload_json->>'count')::int, (payload->>'count')::int, 0),
       coalesce(payload_json->'events'->0->>'type', payload->'events'->0->>'type', '')
  FROM {{.Schema}}.timers
 ORDER BY failed_at IS NULL, due_at, id
 LIMIT $1;

-- name: TimerStats
SELECT count(*) FILTER (WHERE failed_at IS NULL),
       count(*) FILTER (WHERE failed_at IS NOT NULL),
       min(due_at) FILTER (WHERE failed_at IS NULL)
  FROM {{.Schema}}.timers;

-- name: UpsertTask
-- A changed definition (spec, zone, stream or policy) becomes active at $6:
-- no tick from before it fires. Re-adding the same definition changes nothing.
INSERT INTO {{.Schema}}.cron_tasks AS c (name, spec, time_zone, stream_id, missed, active_since)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (name) DO UPDATE
   SET spec = excluded.spec, time_zone = excluded.time_zone, stream_id = excluded.stream_id,
       missed = excluded.missed, active_since = excluded.active_since, updated_at = clock_timestamp()
 WHERE (c.spec, c.time_zone, c.stream_id, c.missed)
       IS DISTINCT FROM (excluded.spec, excluded.time_zone, excluded.stream_id, excluded.missed);

-- name: PauseTask
UPDATE {{.Schema}}.cron_tasks
   SET paused = true, updated_at = clock_timestamp()
 WHERE name = $1
RETURNING name;

-- name: ResumeTask
-- Ticks that fell while the task was paused never fire: it is active again
-- from $2. Resuming a running task changes nothing.
UPDATE {{.Schema}}.cron_tasks
   SET paused = false,
       active_since = CASE WHEN paused THEN $2 ELSE active_since END,
       updated_at = CASE WHEN paused THEN clock_timestamp() ELSE updated_at END
 WHERE name = $1
RETURNING name;

-- name: DeleteTask
WITH d AS (DELETE FROM {{.Schema}}.cron_tasks WHERE name = $1 RETURNING name),
     t AS (DELETE FROM {{.Schema}}.cron_ticks WHERE task IN (SELECT name FROM d))
SELECT count(*) FROM d;

-- name: ListTasks
-- $1 the dispatcher's now. The last column is the task's newest tick fired
-- at or before it (see taskRow.anchor).
SELECT c.name, c.spec, c.time_zone, c.stream_id, c.missed, c.paused, c.active_since, c.last_tick, c.created_at, c.updated_at,
       (SELECT max(t.tick) FROM {{.Schema}}.cron_ticks t WHERE t.task = c.name AND t.tick <= $1)
  FROM {{.Schema}}.cron_tasks c
 ORDER BY c.name;

-- name: LockTask
-- The task a dispatcher is about to fire, locked until it commits. A task
-- another dispatcher is firing is skipped, not waited for.
-- $2 the dispatcher's now (the last column as in ListTasks).
SELECT c.name, c.spec, c.time_zone, c.stream_id, c.missed, c.paused, c.active_since, c.last_tick, c.created_at, c.updated_at,
       (SELECT max(t.tick) FROM {{.Schema}}.cron_ticks t WHERE t.task = c.name AND t.tick <= $2)
  FROM {{.Schema}}.cron_tasks c
 WHERE c.name = $1
   FOR UPDATE OF c SKIP LOCKED;

-- name: RecordTick
-- In the transaction that appends the tick's event: the unique (task, tick)
-- row, and the task's last tick. Returns 1 if the tick is new, 0 if it had
-- been fired already.
WITH t AS (
    INSERT INTO {{.Schema}}.cron_ticks (task, tick, event_id)
    VALUES ($1, $2, $3)
    ON CONFLICT (task, tick) DO NOTHING
    RETURNING 1
), u AS (
    UPDATE {{.Schema}}.cron_tasks SET last_tick = $2, updated_at = clock_timestamp() WHERE name = $1
)
SELECT count(*)::int FROM t;

-- name: SkipTick
-- A missed tick under SkipMissed: the task moves past it without firing.
UPDATE {{.Schema}}.cron_tasks SET last_tick = $2, updated_at = clock_timestamp() WHERE name = $1;

-- name: PruneTicks
-- $1 the oldest tick to keep, $2 the dispatcher's now: each task's newest
-- tick at or before now is kept whatever its age (taskRow.anchor relies
-- on it when a clock ran ahead).
DELETE FROM {{.Schema}}.cron_ticks c
 WHERE c.tick < $1
   AND c.tick < (SELECT max(t.tick) FROM {{.Schema}}.cron_ticks t WHERE t.task = c.task AND t.tick <= $2);
