// Package txopts lets another package of annals choose the options of the
// transaction that eventstore.Store.Transact begins, which are otherwise
// the session's defaults: the scheduler's claims run READ COMMITTED
// whatever the server's default_transaction_isolation says, since under
// REPEATABLE READ or SERIALIZABLE a claim fails to serialize (40001) when
// another dispatcher appends to its stream or deletes a row it skipped.
// Users choose the isolation of their own transactions (AppendTx), so
// Transact keeps no public option for it.
package txopts
