-- The kind recorded for each subscriber name (subscriber_layouts.kind,
-- migration 0044): see kinds.go.

-- name: RecordedKind
-- $1 subscriber: the kind recorded for it ('' when none: no layout row, or
-- a NULL kind), and whether any of its checkpoints moved past 0.
SELECT coalesce((SELECT l.kind FROM {{.Schema}}.subscriber_layouts l WHERE l.subscriber_id = $1), ''),
       EXISTS (SELECT 1 FROM {{.Schema}}.checkpoints c WHERE c.subscriber_id = $1 AND c.position > 0);

-- name: RecordKind
-- Records $2 as subscriber $1's kind if the kind recorded is still $3 (''
-- for NULL), the one the runner judged: a kind another process recorded
-- since is judged again. No row: the layout row is missing or the kind
-- changed.
UPDATE {{.Schema}}.subscriber_layouts
   SET kind = $2
 WHERE subscriber_id = $1 AND coalesce(kind, '') = $3
RETURNING true;
