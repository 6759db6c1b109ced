-- Statements of the checkpoint package.

-- name: Claim
INSERT INTO {{.Schema}}.checkpoints AS c (subscriber_id, partition, position, epoch, owner)
VALUES ($1, $2, 0, 1, $3)
ON CONFLICT (subscriber_id, partition) DO UPDATE
   SET epoch = c.epoch + 1, owner = EXCLUDED.owner, updated_at = clock_timestamp()
RETURNING position, epoch, owner, updated_at;

-- name: Load
SELECT position, epoch, owner, updated_at
  FROM {{.Schema}}.checkpoints
 WHERE subscriber_id = $1 AND partition = $2;

-- name: Commit
-- $3 the leader's epoch, $4 the new position, $5 where the leader knows the
-- checkpoint (CommitFrom): no row when fenced or moved past $5.
UPDATE {{.Schema}}.checkpoints
   SET position = greatest(position, $4), updated_at = clock_timestamp()
 WHERE subscriber_id = $1 AND partition = $2 AND epoch = $3 AND position <= $5
RETURNING position;

-- name: Set
-- The epoch's bump is announced on FenceChannel with FencePayload's
-- digest, delivered when the caller's
-- transaction commits, so that a leader waiting idle lets go at once.
WITH written AS (
    INSERT INTO {{.Schema}}.checkpoints AS c (subscriber_id, partition, position, epoch, owner)
    VALUES ($1, $2, $3, 1, NULL)
    ON CONFLICT (subscriber_id, partition) DO UPDATE
       SET position = EXCLUDED.position, epoch = c.epoch + 1, owner = NULL, updated_at = clock_timestamp()
    RETURNING position, epoch, owner, updated_at)
SELECT w.position, w.epoch, w.owner, w.updated_at
  FROM written w, {{.AnnounceFence "$1" "$2"}} n;

-- name: List
SELECT subscriber_id, partition, position, epoch, owner, updated_at
  FROM {{.Schema}}.checkpoints
 ORDER BY subscriber_id, partition;

-- name: Move
-- An operator's move of an existing checkpoint to $3 (see Store.Move), in
-- one statement: lock the row and read where it was, move it and bump the
-- epoch, and when it moves back, settle the partition's dead letters after
-- $3 (also those an operator skipped) as resolved, since their events are
-- delivered again (one that fails again is open again), as a rebuild
-- settles them, and announce the fence (as Set does). No row (no
-- checkpoint): no row returned, nothing announced.
WITH old AS (
    SELECT position, epoch, owner, updated_at
      FROM {{.Schema}}.checkpoints
     WHERE subscriber_id = $1 AND partition = $2
       FOR UPDATE),
moved AS (
    UPDATE {{.Schema}}.checkpoints AS c
       SET position = $3, epoch = c.epoch + 1, owner = NULL, updated_at = clock_timestamp()
      FROM old
     WHERE c.subscriber_id = $1 AND c.partition = $2
    RETURNING c.position, c.epoch, c.owner, c.updated_at,
              {{.AnnounceFence "$1" "$2"}}),
settled AS (
    UPDATE {{.Schema}}.dead_letters AS d
       SET status = 'resolved', updated_at = clock_timestamp()
      FROM old
     WHERE d.subscriber_id = $1 AND d.partition = $2 AND d.global_sequence > $3
       AND $3 < old.position
       AND d.status IN ('open', 'retry', 'skipped')
    RETURNING 1)
SELECT old.position, old.epoch, old.owner, old.updated_at,
       moved.position, moved.epoch, moved.owner, moved.updated_at,
       (SELECT count(*) FROM settled)
  FROM old, moved;
