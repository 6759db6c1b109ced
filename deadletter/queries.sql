-- Statements of the deadletter package, rendered with the schema as
-- {{.Schema}}. Retry, RetryAll, Skip and Purge each run theirs in one
-- transaction (see store.go).

-- name: Get
SELECT id, subscriber_id, partition, event_id, global_sequence, stream_id, event_type,
       reason, error, error_detail, attempts, status, first_failed_at, last_failed_at,
       created_at, updated_at
  FROM {{.Schema}}.dead_letters
 WHERE id = $1;

-- name: List
-- Newest first: the page of dead letters with IDs below $7 (the cursor
-- Before, or the largest bigint). An empty filter matches everything; $5
-- limit, $6 offset. The ID is unique and follows the order of creation, so
-- a page that starts below the last ID of the one before repeats none of it
-- and passes over nothing, whatever was added or purged meanwhile. A page is
-- one backward index range scan from $7 (the primary key, or with a
-- subscriber or status filter 0028's (subscriber_id, id) or (status, id))
-- that stops after $5 + $6 matching rows.
SELECT id, subscriber_id, partition, event_id, global_sequence, stream_id, event_type,
       reason, error, error_detail, attempts, status, first_failed_at, last_failed_at,
       created_at, updated_at
  FROM {{.Schema}}.dead_letters
 WHERE ($1 = '' OR subscriber_id = $1)
   AND ($2 = '' OR stream_id = $2)
   AND ($3 = '' OR event_type = $3)
   AND ($4 = '' OR status = $4)
   AND id < $7
 ORDER BY id DESC
 LIMIT $5 OFFSET $6;

-- name: ListAfter
-- As List, for the cursor After: the dead letters with IDs above $7 nearest
-- to it, oldest first (the caller reverses the page).
SELECT id, subscriber_id, partition, event_id, global_sequence, stream_id, event_type,
       reason, error, error_detail, attempts, status, first_failed_at, last_failed_at,
       created_at, updated_at
  FROM {{.Schema}}.dead_letters
 WHERE ($1 = '' OR subscriber_id = $1)
   AND ($2 = '' OR stream_id = $2)
   AND ($3 = '' OR event_type = $3)
   AND ($4 = '' OR status = $4)
   AND id > $7
 ORDER BY id
 LIMIT $5 OFFSET $6;

-- name: Lock
-- The dead letter an operator acts on, with every unresolved dead letter of
-- its stream for the same subscriber partition, locked until the
-- transaction ends, so that operators (and the runner) take turns. Rows are
-- locked in the order of the index dead_letters_unresolved, as LockOpen
-- does and the runner's updates of a stream do, so that they cannot
-- deadlock. The rows come back as they are once locked; the one whose id is
-- $1 is always among them (unless it does not exist).
SELECT d.id, d.subscriber_id, d.partition, d.stream_id, d.status
  FROM {{.Schema}}.dead_letters d,
       (SELECT subscriber_id, partition, stream_id FROM {{.Schema}}.dead_letters WHERE id = $1) t
 WHERE d.subscriber_id = t.subscriber_id AND d.partition = t.partition AND d.stream_id = t.stream_id
   AND (d.status IN ('open', 'retry') OR d.id = $1)
 ORDER BY d.global_sequence, d.id
   FOR UPDATE OF d;

-- name: LockOpen
-- Every open dead letter of subscriber $1, locked in index order (see Lock).
SELECT id
  FROM {{.Schema}}.dead_letters
 WHERE subscriber_id = $1 AND status = 'open'
 ORDER BY partition, stream_id, global_sequence, id
   FOR UPDATE;

-- name: MarkSkipped
UPDATE {{.Schema}}.dead_letters
   SET status = 'skipped', updated_at = clock_timestamp()
 WHERE id = $1;

-- name: Release
-- Marks for re-delivery every open dead letter of subscriber $1, of one
-- stream $3 of partition $2 (ReleaseStream: Retry and Skip) or, with $2 and
-- $3 NULL, of every partition (ReleaseSubscriber: RetryAll); returns their
-- IDs by partition, then in the order the runner re-delivers them, each
-- with whether its event is gone. An entry whose event is no longer in the
-- log (a hard delete and scavenge, a truncation or retention removed it)
-- cannot be re-delivered: it is skipped instead (gone), with why in front
-- of its last error; projection's SettleGone writes the same for one
-- released before its event went.
WITH candidates AS (
    SELECT d.id, NOT EXISTS (SELECT 1 FROM {{.Schema}}.events_all e WHERE e.global_sequence = d.global_sequence) AS gone
      FROM {{.Schema}}.dead_letters d
     WHERE d.subscriber_id = $1 AND d.status = 'open'
       AND ($2::int IS NULL OR d.partition = $2::int) AND ($3::text IS NULL OR d.stream_id = $3::text)
), released AS (
    UPDATE {{.Schema}}.dead_letters d
       SET status = CASE WHEN c.gone THEN 'skipped' ELSE 'retry' END, updated_at = clock_timestamp(),
           error = CASE WHEN c.gone
                        THEN 'not delivered: the event no longer exists in the log (removed by a hard delete and scavenge, '
                             || 'a truncation or retention), so it was skipped' || E'\nlast error: ' || d.error
                        ELSE d.error END
      FROM candidates c
     WHERE d.id = c.id AND d.status = 'open'
    RETURNING d.id, d.partition, d.global_sequence, c.gone
)
SELECT id, gone FROM released ORDER BY partition, global_sequence, id;

-- name: Resume
-- Clears the Stop of subscriber $1, partition $2 (NULL: every partition);
-- returns what was cleared, by partition.
WITH stopped AS (
    SELECT subscriber_id, partition, stopped_reason, stopped_at
      FROM {{.Schema}}.checkpoints
     WHERE subscriber_id = $1 AND ($2::integer IS NULL OR partition = $2)
       AND stopped_reason IS NOT NULL
       FOR UPDATE
), resumed AS (
    UPDATE {{.Schema}}.checkpoints c
       SET stopped_reason = NULL, stopped_at = NULL, updated_at = clock_timestamp()
      FROM stopped s
     WHERE c.subscriber_id = s.subscriber_id AND c.partition = s.partition
    RETURNING s.partition, s.stopped_reason, s.stopped_at
)
SELECT partition, stopped_reason, stopped_at FROM resumed ORDER BY partition;

-- name: SubscriberKnown
-- Whether the subscriber has ever had a dead letter or a checkpoint.
SELECT EXISTS (SELECT 1 FROM {{.Schema}}.dead_letters WHERE subscriber_id = $1)
    OR EXISTS (SELECT 1 FROM {{.Schema}}.checkpoints WHERE subscriber_id = $1);

-- name: Purge
-- $1 cutoff (inclusive), $2 whether open and retry entries go too. The
-- failed attempts of the purged entries' events go with them (they are
-- kept only as a dead letter's history). Returns the entries purged.
WITH gone AS (
    DELETE FROM {{.Schema}}.dead_letters
     WHERE updated_at <= $1
       AND ($2 OR status IN ('resolved', 'skipped'))
    RETURNING subscriber_id, event_id
), attempts AS (
    DELETE FROM {{.Schema}}.failures f
     USING gone g
     WHERE f.subscriber_id = g.subscriber_id AND f.event_id = g.event_id
)
SELECT count(*) FROM gone;
