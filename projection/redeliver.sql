-- The re-delivery of a released dead letter.

-- name: LockRedelivery
-- Locks dead letter $1 for its re-delivery, in the transaction that then
-- resolves it, and returns its status: an operator's Skip (or Retry, or
-- Purge) of it waits until the re-delivery has committed or rolled back,
-- so that an entry the handler got is never marked skipped (resolved
-- without delivery), and the runner delivers nothing an operator skipped
-- first (status is no longer retry then). $2, when not NULL, is the
-- transaction's idle_in_transaction_session_timeout (in milliseconds): an
-- observer's handler runs while the transaction waits, and a handler that
-- overruns its timeout must not hold the lock for long.
WITH bound AS (
    SELECT set_config('idle_in_transaction_session_timeout',
                      coalesce($2::text, current_setting('idle_in_transaction_session_timeout')), true)
)
SELECT d.status
  FROM {{.Schema}}.dead_letters d, bound
 WHERE d.id = $1
   FOR UPDATE OF d;
