-- The failed attempts a new leader of a subscriber partition inherits.

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
