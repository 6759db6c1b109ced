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
UPDATE {{.Schema}}.checkpoints
   SET position = greatest(position, $4), updated_at = clock_timestamp()
 WHERE subscriber_id = $1 AND partition = $2 AND epoch = $3
RETURNING position;

-- name: Set
INSERT INTO {{.Schema}}.checkpoints AS c (subscriber_id, partition, position, epoch, owner)
VALUES ($1, $2, $3, 1, NULL)
ON CONFLICT (subscriber_id, partition) DO UPDATE
   SET position = EXCLUDED.position, epoch = c.epoch + 1, owner = NULL, updated_at = clock_timestamp()
RETURNING position, epoch, owner, updated_at;

-- name: List
SELECT subscriber_id, partition, position, epoch, owner, updated_at
  FROM {{.Schema}}.checkpoints
 ORDER BY subscriber_id, partition;
