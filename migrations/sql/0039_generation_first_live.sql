-- annals schema: a blue/green generation keeps the time it first went live.
--
-- A rollback that makes a generation live again set its live_since to the
-- time of the rollback: g1 → g2, then a rollback to g1, and g1 read as live
-- since after g2, which replaced it. A rollback now first keeps live_since
-- in first_live_since, unless that has a time already, and then sets
-- live_since: first_live_since is the time the generation first went live,
-- live_since the time it last did. A generation that went live once has
-- NULL, its live_since being both. projection.ListGenerations reads the
-- first as LiveSince and the last, when they differ, as LiveAgain.
--
-- A generation rolled back to before this migration (or, after it, by an
-- annals binary older than it) lost the first time: its live_since, the
-- time it last went live, is kept as the first from then on. Nullable and
-- without a default, the column is added without rewriting the table; the
-- runner and operator roles' table-wide UPDATE on read_model_generations
-- (`annals grant`) covers it.

ALTER TABLE {{.Schema}}.read_model_generations ADD COLUMN first_live_since timestamptz;

COMMENT ON COLUMN {{.Schema}}.read_model_generations.first_live_since IS
    'annals: when the generation first went live, set once a rollback made it live again (NULL: live_since, when it last went live, is the first); projection.ListGenerations reads it as LiveSince.';
