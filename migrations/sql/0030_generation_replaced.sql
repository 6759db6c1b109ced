-- annals schema: each blue/green generation records the generation it
-- replaced at its cut-over.
--
-- projection.Rollback picked the retired (not dropped) generation with the
-- highest number below the live one's. That can revive a generation an
-- operator rolled back from: g1 → g2, a rollback to g1 (g2 retired), g3
-- built and cut over from g1; a rollback then went to g2, not to g1, the
-- generation g3 replaced. The cut-over now records in `replaced` which
-- generation was live before it (NULL: none), and Rollback goes back to
-- that one. A rollback that makes a generation live again leaves its
-- `replaced` as it was, so rolling back further goes on down the chain
-- of cut-overs instead of forward again.
--
-- Generations cut over before this migration (or, after it, by an annals
-- binary older than it) have NULL; for them Rollback keeps the old rule. Nullable and without a default, the column is added
-- without rewriting the table. The runner and operator roles' table-wide
-- UPDATE on read_model_generations (`annals grant`) covers it.

ALTER TABLE {{.Schema}}.read_model_generations ADD COLUMN replaced integer;

COMMENT ON COLUMN {{.Schema}}.read_model_generations.replaced IS
    'annals: the generation that was live before the cut-over that made this one live (NULL: none, or cut over before migration 0030); projection.Rollback goes back to it.';
