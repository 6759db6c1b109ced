-- Statements of the operator console (package console), rendered with the
-- schema as {{.Schema}}. Every read is bounded: by a LIMIT on an index
-- order, or by a cap on what it counts.

-- name: Head
-- The head of the log (0 when empty) and the server's clock.
SELECT greatest((SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events),
                (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events_archive)), now();

-- name: RecentRate
-- Events per minute over the last $1 minutes, counted among the newest $2
-- events (an index scan backwards over positions, so the cost is bounded
-- whatever the log's size). Minutes with no event are absent.
SELECT date_trunc('minute', recorded_at) AS minute, count(*)
  FROM (SELECT recorded_at
          FROM {{.Schema}}.events
         ORDER BY global_sequence DESC
         LIMIT $2) AS recent
 WHERE recorded_at > now() - $1::int * interval '1 minute'
 GROUP BY 1
 ORDER BY 1;

-- name: Subscribers
-- One row per subscriber partition, as `annals status` reads it. $1:
-- staleness threshold in microseconds; $2: how many lagging events to count
-- at most; $3: one subscriber, or NULL for all.
--
-- The heartbeat leader (leadership.HeartbeatLeaderJoin, as annals status
-- reads it) is a fact, not the leader, which package leadership decides
-- with the lock (leadership.LockStates).
SELECT c.subscriber_id, c.partition, c.position, c.epoch, coalesce(c.owner, ''), c.updated_at,
       lag.events,
       coalesce(greatest(0, extract(epoch FROM now() - oldest.recorded_at))::float8, 0),
       coalesce(heartbeat_leader.instance_id, ''), heartbeat_leader.epoch, coalesce(c.stopped_reason, ''), c.stopped_at,
       (SELECT count(*) FROM {{.Schema}}.dead_letters d
         WHERE d.subscriber_id = c.subscriber_id AND d.partition = c.partition
           AND d.status IN ('open', 'retry'))
  FROM {{.Schema}}.checkpoints c
 CROSS JOIN LATERAL (
        SELECT count(*) AS events
          FROM (SELECT 1
                  FROM {{.Schema}}.events_all e
                 WHERE e.global_sequence > c.position
                 ORDER BY e.global_sequence
                 LIMIT $2::bigint + 1) AS capped
       ) AS lag
  LEFT JOIN LATERAL (
        SELECT e.recorded_at
          FROM {{.Schema}}.events_all e
         WHERE e.global_sequence > c.position
         ORDER BY e.global_sequence
         LIMIT 1
       ) AS oldest ON true
  {{.HeartbeatLeader "c" "$1"}}
 WHERE $3::text IS NULL OR c.subscriber_id = $3
 ORDER BY c.subscriber_id, c.partition;

-- name: CanReadGenerations
-- Whether the role may read read_model_generations (a role granted by an
-- older annals grant may not: the console then shows no generations), as
-- `annals status` asks. $1: the schema's name.
SELECT coalesce(has_table_privilege(to_regclass(format('%I.%I', $1::text, 'read_model_generations')), 'SELECT'), false);

-- name: Generations
-- The blue/green generations of read models that are not dropped, by
-- subscriber (<read model>#g<N>), as `annals status` reads them; of one
-- subscriber when $1 is not NULL.
SELECT g.subscriber, g.projection, g.generation, g.state
  FROM {{.Schema}}.read_model_generations g
 WHERE g.state <> 'dropped'
   AND ($1::text IS NULL OR g.subscriber = $1);

-- name: CanReadKinds
-- Whether the role may read subscriber_layouts, where the runner records
-- each subscriber's kind (a role granted by an older annals may not: the
-- console then shows every kind unknown), as `annals status` asks. $1: the
-- schema's name.
SELECT coalesce(has_table_privilege(to_regclass(format('%I.%I', $1::text, 'subscriber_layouts')), 'SELECT'), false);

-- name: Kinds
-- The kind the runner recorded for each subscriber (migration 0044), of one
-- subscriber when $1 is not NULL, as `annals status` reads it: through the
-- row's JSON, so that a schema before 0044, without the column, answers no
-- kinds instead of failing the page's transaction.
SELECT l.subscriber_id, to_jsonb(l) ->> 'kind'
  FROM {{.Schema}}.subscriber_layouts l
 WHERE to_jsonb(l) ->> 'kind' IS NOT NULL
   AND ($1::text IS NULL OR l.subscriber_id = $1);

-- name: Instances
-- Every registered runner instance. $1: staleness threshold in microseconds.
SELECT instance_id, host, pid, started_at, last_heartbeat,
       CASE WHEN jsonb_typeof(leads) = 'array' THEN leads ELSE '[]'::jsonb END,
       last_heartbeat > now() - $1::bigint * interval '1 microsecond',
       greatest(0, extract(epoch FROM now() - last_heartbeat))::float8
  FROM {{.Schema}}.instances
 ORDER BY instance_id;

-- name: DeadLetterCounts
-- Dead letters by subscriber and status.
SELECT subscriber_id, status, count(*)
  FROM {{.Schema}}.dead_letters
 GROUP BY 1, 2
 ORDER BY 1, 2;

-- name: Failures
-- Failures in progress of one subscriber: events with failed attempts that
-- are not (yet) dead letters, with their attempt count, first and last
-- failure, the last error and when the runner retries it (the last
-- attempt's retry_at). $1: subscriber; $2: at most this many events.
SELECT f.partition, f.event_id, f.global_sequence, count(*)::int, min(f.failed_at), max(f.failed_at),
       last.error, last.retry_at,
       coalesce(e.stream_id, ''), coalesce(e.event_type, '')
  FROM {{.Schema}}.failures f
  LEFT JOIN {{.Schema}}.events_all e ON e.global_sequence = f.global_sequence
 CROSS JOIN LATERAL (
        SELECT l.error, l.retry_at
          FROM {{.Schema}}.failures l
         WHERE l.subscriber_id = f.subscriber_id AND l.event_id = f.event_id
         ORDER BY l.attempt DESC, l.id DESC
         LIMIT 1
       ) AS last
 WHERE f.subscriber_id = $1
   AND NOT EXISTS (SELECT 1 FROM {{.Schema}}.dead_letters d
                    WHERE d.subscriber_id = f.subscriber_id AND d.event_id = f.event_id
                      AND d.status IN ('open', 'resolved', 'skipped'))
 GROUP BY f.subscriber_id, f.partition, f.event_id, f.global_sequence, e.stream_id, e.event_type,
          last.error, last.retry_at
 ORDER BY f.global_sequence
 LIMIT $2;

-- name: Streams
-- Streams whose ID starts with $1 (a LIKE pattern with its wildcards
-- escaped), from $2 on (exclusive), at most $3.
SELECT stream_id, version, created_at, updated_at
  FROM {{.Schema}}.streams
 WHERE stream_id LIKE $1 AND stream_id > $2
 ORDER BY stream_id
 LIMIT $3;

-- name: StreamEvents
-- A stream's events from version $2 on, at most $3, with the first $4
-- characters of data and metadata and their whole size in bytes (a page of
-- big events does not carry them whole).
SELECT global_sequence, event_id, stream_id, stream_version, event_type,
       left(data::text, $4), octet_length(data::text),
       coalesce(left(metadata::text, $4), ''), coalesce(octet_length(metadata::text), 0), recorded_at
  FROM {{.Schema}}.events_all
 WHERE stream_id = $1 AND stream_version >= $2
 ORDER BY stream_version
 LIMIT $3;

-- name: LogEvents
-- The log after position $1 up to position $4 (the caller bounds the scan,
-- so a rare type does not make one page read the whole log), at most $2
-- events, whose type matches the regular expression $3 (NULL: every type);
-- data and metadata cut to $5 characters, with their whole size in bytes.
SELECT global_sequence, event_id, stream_id, stream_version, event_type,
       left(data::text, $5), octet_length(data::text),
       coalesce(left(metadata::text, $5), ''), coalesce(octet_length(metadata::text), 0), recorded_at
  FROM {{.Schema}}.events_all
 WHERE global_sequence > $1 AND global_sequence <= $4
   AND ($3::text IS NULL OR event_type ~ $3)
 ORDER BY global_sequence
 LIMIT $2;

-- name: LogEventsBefore
-- The page before position $1 down to position $4 (newest first; the caller
-- reverses it), as LogEvents.
SELECT global_sequence, event_id, stream_id, stream_version, event_type,
       left(data::text, $5), octet_length(data::text),
       coalesce(left(metadata::text, $5), ''), coalesce(octet_length(metadata::text), 0), recorded_at
  FROM {{.Schema}}.events_all
 WHERE global_sequence < $1 AND global_sequence >= $4
   AND ($3::text IS NULL OR event_type ~ $3)
 ORDER BY global_sequence DESC
 LIMIT $2;

-- name: Event
-- One event by position, data and metadata cut to $2 characters.
SELECT global_sequence, event_id, stream_id, stream_version, event_type,
       left(data::text, $2), octet_length(data::text),
       coalesce(left(metadata::text, $2), ''), coalesce(octet_length(metadata::text), 0), recorded_at
  FROM {{.Schema}}.events_all
 WHERE global_sequence = $1;

-- name: EventByID
-- One event by ID, as Event.
SELECT global_sequence, event_id, stream_id, stream_version, event_type,
       left(data::text, $2), octet_length(data::text),
       coalesce(left(metadata::text, $2), ''), coalesce(octet_length(metadata::text), 0), recorded_at
  FROM {{.Schema}}.events_all
 WHERE event_id = $1;

-- name: EventRaw
-- One event's data ($2 false) or metadata ($2 true) whole, as stored; no
-- row when there is no event at position $1.
SELECT CASE WHEN $2 THEN metadata::text ELSE data::text END
  FROM {{.Schema}}.events_all
 WHERE global_sequence = $1;

-- name: Audit
-- One entry of the audit trail; the trigger stamps its ID, time and role.
INSERT INTO {{.Schema}}.audit_log (actor, action, target, detail)
VALUES ($1, $2, $3, $4)
RETURNING id;

-- name: AuditList
-- The newest audit entries, before ID $1, at most $2.
SELECT id, at, actor, db_role, action, target, detail::text
  FROM {{.Schema}}.audit_log
 WHERE id < $1
 ORDER BY id DESC
 LIMIT $2;

-- name: CanOperate
-- Whether the session's role may do what the console's actions do: change
-- dead letters and checkpoints, pause cron tasks, delete dead letters (and
-- a purged one's failed attempts), and record the action in the audit log
-- (the operator kind of `annals grant`).
-- Each privilege is asked on its own: has_table_privilege with a list
-- ('UPDATE, DELETE') is true when any one of them is held.
SELECT coalesce(has_table_privilege(to_regclass(format('%I.%I', $1::text, 'dead_letters')), 'UPDATE')
   AND has_table_privilege(to_regclass(format('%I.%I', $1::text, 'dead_letters')), 'DELETE')
   AND has_table_privilege(to_regclass(format('%I.%I', $1::text, 'failures')), 'DELETE')
   AND has_table_privilege(to_regclass(format('%I.%I', $1::text, 'checkpoints')), 'UPDATE')
   AND has_table_privilege(to_regclass(format('%I.%I', $1::text, 'cron_tasks')), 'UPDATE')
   AND has_table_privilege(to_regclass(format('%I.%I', $1::text, 'audit_log')), 'INSERT'), false);

-- name: TimerCounts
-- Pending and failed timers.
SELECT count(*) FILTER (WHERE failed_at IS NULL), count(*) FILTER (WHERE failed_at IS NOT NULL)
  FROM {{.Schema}}.timers;
