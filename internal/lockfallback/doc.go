// Package lockfallback lets a client of the current annals take one of the
// locks that migration 0034 moved into schema functions (snapshot_lock,
// inline_stream_lock) on a schema migrated before 0034: a binary deployed
// before `annals migrate` ran.
//
// The lock is taken through the schema's function while it exists. The
// first undefined_function (42883) switches the client to PostgreSQL's
// advisory-lock function on the same key, as clients before 0034 took it,
// so that processes of both versions still exclude each other; an
// insufficient_privilege (42501) of that function (advisory locks
// restricted since, which needs 0034) switches it back. The statement that
// failed was its transaction's first, so the caller makes the attempt
// again, once; a schema on which neither works fails with
// migrations.ErrNotMigrated.
package lockfallback
