-- name: Checkpoint
-- The position a subscriber partition's checkpoint holds (0: none yet).
SELECT coalesce((SELECT position FROM {{.Schema}}.checkpoints
                  WHERE subscriber_id = $1 AND partition = $2), 0);
