// Package pgtx runs a transaction again when PostgreSQL aborted it as a
// deadlock victim or for a serialization failure: such a transaction
// changed nothing, so an idempotent one may simply be run again.
package pgtx
