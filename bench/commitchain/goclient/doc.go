// Command goclient measures 4 writers × 100-event appends through
// Store.Append, with the default group commit and with large appends sent
// as parallel groups (GroupCommit{MaxEvents: 100, MaxInFlight: 4,
// ParallelEvents: -1}), beside raw INSERTs of the same rows, three rounds
// of 3 s each. Run it on a cluster as shipped and on one whose
// append_batch is the commit chain (annals_swap.sql), alternating:
//
//	annals dev --port 55408 -- sleep 900 &   # shipped
//	annals dev --port 55409 -- sleep 900 &   # chain
//	psql "$B" -f bench/commitchain/setup.sql -f bench/commitchain/annals_swap.sql
//	DATABASE_URL=$A go run ./bench/commitchain/goclient shipped
//	DATABASE_URL=$B go run ./bench/commitchain/goclient chain
//
// The argument labels the lines it prints. See docs/benchmarks.md, "Third
// 2026-11-30 session".
package main
