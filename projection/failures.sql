-- What the runner records when handlers fail, what a new leader inherits of
-- it, and the re-delivery of released dead letters.

-- name: RecordFailure
-- One row per failed attempt; returns the attempt number (counting earlier
-- runs too, so a crash-looping process does not retry forever). Fenced like
-- every write of a leader: $6 must still be the checkpoint's epoch, or
-- nothing is recorded and no row is returned (the leader was fenced by a new
-- leader, a rebuild or an operator's checkpoint set). FOR SHARE waits for a
-- claim in progress and re-checks the epoch after it commits.
INSERT INTO {{.Schema}}.failures (subscriber_id, partition, event_id, global_sequence, attempt, error)
SELECT $1, $2, $3, $4,
       coalesce((SELECT max(f.attempt) FROM {{.Schema}}.failures f
                  WHERE f.subscriber_id = $1 AND f.event_id = $3), 0) + 1,
       $5
  FROM {{.Schema}}.checkpoints c
 WHERE c.subscriber_id = $1 AND c.partition = $2 AND c.epoch = $6
   FOR SHARE OF c
RETURNING attempt;

-- name: RetryAt
-- When the failed attempt $3 of an event will be retried: now + $4
-- microseconds (what the operator console shows).
UPDATE {{.Schema}}.failures
   SET retry_at = clock_timestamp() + $4::bigint * interval '1 microsecond'
 WHERE subscriber_id = $1 AND event_id = $2 AND attempt = $3;

-- name: ForgetFailures
-- The failed attempts of an event that has now been handled.
DELETE FROM {{.Schema}}.failures WHERE subscriber_id = $1 AND event_id = $2;

-- name: Epoch
-- The epoch of a subscriber partition's checkpoint: a leader waiting to
-- retry a failing event checks that it still leads.
SELECT epoch FROM {{.Schema}}.checkpoints WHERE subscriber_id = $1 AND partition = $2;

-- name: DeadLetter
-- $7 reason, $10 status. attempts and the failure times come from failures.
INSERT INTO {{.Schema}}.dead_letters AS d
       (subscriber_id, partition, event_id, global_sequence, stream_id, event_type,
        reason, error, error_detail, attempts, status, first_failed_at, last_failed_at)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, count(f.id), $10, min(f.failed_at), max(f.failed_at)
  FROM {{.Schema}}.failures f
 WHERE f.subscriber_id = $1 AND f.event_id = $3
ON CONFLICT (subscriber_id, event_id) DO UPDATE
   SET reason = EXCLUDED.reason, error = EXCLUDED.error, error_detail = EXCLUDED.error_detail,
       attempts = EXCLUDED.attempts, status = EXCLUDED.status,
       first_failed_at = coalesce(d.first_failed_at, EXCLUDED.first_failed_at),
       last_failed_at = EXCLUDED.last_failed_at, updated_at = clock_timestamp()
 -- An event read again (after a crash or a rewind) never turns an unresolved
 -- entry into a parked one: its real error and stack stay.
 WHERE NOT (d.status IN ('open', 'retry') AND EXCLUDED.reason = 'parked');

-- name: ParkedStreams
-- The streams of $3 that have unresolved dead letters, whether any of them is
-- still open (not yet released by an operator), and the first such position:
-- only events after it are parked behind it.
SELECT stream_id, bool_or(status = 'open'), min(global_sequence)
  FROM {{.Schema}}.dead_letters
 WHERE subscriber_id = $1 AND partition = $2 AND status IN ('open', 'retry')
   AND stream_id = ANY($3)
 GROUP BY stream_id;

-- name: Stop
UPDATE {{.Schema}}.checkpoints
   SET stopped_reason = $4, stopped_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE subscriber_id = $1 AND partition = $2 AND epoch = $3;

-- name: Released
-- Dead letters an operator released, with their events, in position order.
-- gone: the event is no longer in the log (a hard delete and scavenge, a
-- truncation or retention removed it); its event columns are then the dead
-- letter's own, or zero, and it is settled with SettleGone, never delivered.
SELECT d.id, e.global_sequence IS NULL AS gone, d.global_sequence, d.event_id,
       coalesce(e.stream_id, d.stream_id), coalesce(e.stream_version, 0),
       coalesce(e.event_type, d.event_type), e.data, e.metadata, coalesce(e.recorded_at, d.created_at)
  FROM {{.Schema}}.dead_letters d
  LEFT JOIN {{.Schema}}.events_all e ON e.global_sequence = d.global_sequence
 WHERE d.subscriber_id = $1 AND d.partition = $2 AND d.status = 'retry'
 ORDER BY d.global_sequence
 LIMIT $3;

-- name: SettleGone
-- Released dead letters $1 whose events are no longer in the log: they can
-- never be delivered, so they are skipped (resolved without delivery, as
-- an operator's skip), with why in front of their last error, which the
-- console and annals dlq show. The same text as deadletter's Release
-- writes when an operator releases such an entry. Returns the entries
-- settled (one that an operator skipped meanwhile, or whose event is there
-- after all, is left alone).
UPDATE {{.Schema}}.dead_letters d
   SET status = 'skipped', updated_at = clock_timestamp(),
       error = 'not delivered: the event no longer exists in the log (removed by a hard delete and scavenge, '
               || 'a truncation or retention), so it was skipped' || E'\nlast error: ' || d.error
 WHERE d.id = ANY($1) AND d.status = 'retry'
   AND NOT EXISTS (SELECT 1 FROM {{.Schema}}.events_all e WHERE e.global_sequence = d.global_sequence)
RETURNING d.id;

-- name: Resolve
UPDATE {{.Schema}}.dead_letters
   SET status = 'resolved', updated_at = clock_timestamp()
 WHERE id = $1 AND status = 'retry';

-- name: Reopen
-- A re-delivery failed: the entry and the released entries behind it in its
-- stream go back to open (the stream stays parked, in order).
UPDATE {{.Schema}}.dead_letters
   SET status = 'open', updated_at = clock_timestamp(),
       error = CASE WHEN id = $3 THEN $5 ELSE error END,
       error_detail = CASE WHEN id = $3 THEN $6 ELSE error_detail END,
       attempts = CASE WHEN id = $3 THEN attempts + 1 ELSE attempts END,
       last_failed_at = CASE WHEN id = $3 THEN clock_timestamp() ELSE last_failed_at END
 WHERE subscriber_id = $1 AND partition = $2 AND stream_id = $4 AND status = 'retry';


-- name: InheritFailures
-- Run when a leadership starts, at checkpoint $3 of subscriber $1's
-- partition $2. Returns the events above the checkpoint that have failed
-- attempts (made by any leader, this process or another, before a
-- handover, a crash or a restart) and are no dead letter, with their last
-- attempt number: the leader deletes their rows when it handles them
-- (ForgetFailures), as it does for its own. And it deletes the failed
-- attempts at or below the checkpoint of events that are no dead letter:
-- such an event was handled by a leader that did not know of them, or
-- passed over by an operator's checkpoint set, and its rows would stay for
-- ever (the console would list them as a failure in progress, and after a
-- rewind the event would start with part of its retries spent). The
-- attempts of dead-lettered events stay with their dead letter.
WITH stale AS (
    DELETE FROM {{.Schema}}.failures f
     WHERE f.subscriber_id = $1 AND f.partition = $2 AND f.global_sequence <= $3
       AND NOT EXISTS (SELECT 1 FROM {{.Schema}}.dead_letters d
                        WHERE d.subscriber_id = f.subscriber_id AND d.event_id = f.event_id)
)
SELECT f.event_id, max(f.attempt)
  FROM {{.Schema}}.failures f
 WHERE f.subscriber_id = $1 AND f.partition = $2 AND f.global_sequence > $3
   AND NOT EXISTS (SELECT 1 FROM {{.Schema}}.dead_letters d
                    WHERE d.subscriber_id = f.subscriber_id AND d.event_id = f.event_id)
 GROUP BY f.event_id;


-- name: LockRedelivery
-- Locks dead letter $1 for its re-delivery, in the transaction that then
-- resolves it, and returns its status: an operator's Skip (or Retry, or
-- Purge) of it waits until the re-delivery has committed or rolled back,
-- so that an entry the handler got is never marked skipped (resolved
-- without delivery), and the runner delivers nothing an operator skipped
-- first (status is no longer retry then). (How long the lock may be held
-- idle is the transaction's idle limit, set by its BEGIN.)
SELECT d.status
  FROM {{.Schema}}.dead_letters d
 WHERE d.id = $1
   FOR UPDATE OF d;
