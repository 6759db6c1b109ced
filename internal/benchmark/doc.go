// Package benchmark measures annals against raw PostgreSQL doing the same
// work in the same run, so that the figures survive a noisy machine: what
// matters is the ratio, not the absolute number.
//
// Append (append.go): events/s for 1, 4 and 16 concurrent writers appending
// 1 or 100 events per transaction, beside (a) a plain INSERT of the same rows
// numbered by a sequence with no ordering lock and (b) the same INSERT under
// a transaction-scoped advisory lock, each one statement per transaction in
// one round trip. The three run back to back for every combination.
package benchmark
