-- One positioning transaction: up to 1000 committed, unpositioned rows, in
-- id order, get the next positions (derived from the ordered id list, not
-- from nextval per row, which would follow the plan's row order).
WITH todo AS (
    SELECT id, row_number() OVER (ORDER BY id) AS rn
      FROM seqproto.events WHERE global_sequence IS NULL ORDER BY id LIMIT 1000
), base AS (
    SELECT CASE WHEN n > 0 THEN setval('seqproto.positions', nextval('seqproto.positions') + n - 1) - n END AS b
      FROM (SELECT count(*) AS n FROM todo) c
)
UPDATE seqproto.events e SET global_sequence = base.b + todo.rn
  FROM todo, base WHERE e.id = todo.id;
