-- Statements of Runner.Rebuild.

-- name: ResetCheckpoint
-- Sets the checkpoint of a subscriber partition back to 0 (and clears a stop)
-- if $3 is still its epoch: the rebuild's leadership is fenced like every
-- leader's. Runs in the transaction that also calls the projection's Reset.
UPDATE {{.Schema}}.checkpoints
   SET position = 0, stopped_reason = NULL, stopped_at = NULL, updated_at = clock_timestamp()
 WHERE subscriber_id = $1 AND partition = $2 AND epoch = $3;

-- name: SupersedeDeadLetters
-- The rebuild delivers every event again, so the subscriber's dead letters,
-- also those an operator skipped, are settled as resolved: an event that
-- fails again is dead-lettered again (the entry goes back to open, with the
-- new error), and one the replay applies is resolved, which Await then
-- reports as applied. Without this, a stream parked before the rebuild would
-- stay parked behind an event the rebuild applies, and Await would report a
-- skipped dead letter for an event the rebuilt read model holds.
UPDATE {{.Schema}}.dead_letters
   SET status = 'resolved', updated_at = clock_timestamp()
 WHERE subscriber_id = $1 AND status IN ('open', 'retry', 'skipped');

-- name: CountEvents
-- The events a rebuild replays, per partition: $1 head (inclusive), $2 type
-- regex or NULL, $3 partitions, $4 and $5 the partition key (as in the
-- catch-up engine's ReadBatch), $6 the position each partition starts
-- after (indexed by partition + 1; NULL or missing: 0). The second count
-- is all of them through $1, the third those through the partition's start
-- (already replayed: a resumed blue/green rebuild).
SELECT part, count(*), count(*) FILTER (WHERE seq <= coalesce(($6::bigint[])[part + 1], 0))
  FROM (SELECT CASE WHEN $3::int <= 1 THEN 0 ELSE {{.Schema}}.stream_partition(
                   CASE $4::text WHEN 'category' THEN split_part(e.stream_id, '-', 1)
                                 WHEN 'metadata' THEN coalesce(e.metadata ->> $5::text, '')
                                 ELSE e.stream_id END, $3) END AS part,
               e.global_sequence AS seq
          FROM {{.Schema}}.events_all e
         WHERE e.global_sequence <= $1
           AND ($2::text IS NULL OR e.event_type ~ $2)) x
 GROUP BY part;

-- name: ForgetFailures
-- The failed attempts recorded before the rebuild: the replay starts every
-- event's retry count afresh, so an event that failed before is retried by
-- the policy again rather than dead-lettered at its first failure. Runs in
-- the reset's transaction, after the rebuild fenced every earlier leader (a
-- fenced leader records no more attempts).
DELETE FROM {{.Schema}}.failures WHERE subscriber_id = $1;

-- name: FenceAllCheckpoints
-- A rebuild that changes the subscriber's partition layout: every
-- checkpoint of subscriber $1, whatever its partition, back to 0 with a new
-- epoch (fencing the old layout's leaders: their batches in flight cannot
-- commit), owned by the rebuild ($2: so that no instance of another layout
-- replaces the layout meanwhile, see catchup's RecordLayout) and no stop. Runs in the transaction that empties the read model
-- and records the new layout. Each fence is announced (checkpoint.FenceChannel,
-- delivered at commit), so that an idle leader lets go at once.
UPDATE {{.Schema}}.checkpoints
   SET position = 0, epoch = epoch + 1, owner = $2, stopped_reason = NULL, stopped_at = NULL,
       updated_at = clock_timestamp()
 WHERE subscriber_id = $1
RETURNING {{.AnnounceFence "subscriber_id" "partition"}};

-- name: ReplaceLayout
-- Records $2 partitions by $3 as subscriber $1's layout (in the transaction
-- above, which set every checkpoint to 0): from its commit on, only claims
-- of the new layout succeed.
INSERT INTO {{.Schema}}.subscriber_layouts AS l (subscriber_id, partitions, partition_by)
VALUES ($1, $2, $3)
ON CONFLICT (subscriber_id) DO UPDATE
   SET partitions = excluded.partitions, partition_by = excluded.partition_by, recorded_at = clock_timestamp();

-- name: CanDeleteCheckpoints
-- Whether the role may delete checkpoints (the schema's owner and
-- superusers may; the runner kind may not). $1: the schema's name.
SELECT coalesce(has_table_privilege(to_regclass(format('%I.%I', $1::text, 'checkpoints')), 'DELETE'), false);

-- name: DeleteSurplusCheckpoints
-- A rebuild to fewer partitions: the checkpoints of subscriber $1's
-- partitions from $2 on, which the new layout does not have.
DELETE FROM {{.Schema}}.checkpoints WHERE subscriber_id = $1 AND partition >= $2;
