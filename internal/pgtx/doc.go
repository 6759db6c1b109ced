// Package pgtx runs a transaction again when PostgreSQL aborted it as a
// deadlock victim or for a serialization failure: such a transaction
// changed nothing, so an idempotent one may simply be run again. It also
// says how annals begins its transactions: READ COMMITTED whatever the
// session's default (ReadCommitted), and with a limit on how long they may
// idle between statements (IdleSetup, BeginIdle).
package pgtx
