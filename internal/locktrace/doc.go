// Package locktrace measures, in tests, how long transactions hold the
// log's ordering lock: a pgx tracer that counts the round trips a connection
// sends after an append_events (or append_events_json) call of its
// transaction and before that transaction's COMMIT or ROLLBACK (the append's
// transaction-scoped advisory lock is held all that time, and every other
// append in the database waits for it). A pipelined batch that ends with the COMMIT is one round trip that
// starts without the lock, so sending the appends and the COMMIT together
// counts zero. A ROLLBACK after a failed pipeline is counted apart.
//
// Install a Tracer as a pool's ConnConfig.Tracer (connections copied from
// that config, such as a runner's lock connections, inherit it). Test
// support only.
package locktrace
