// Command peers measures annals side by side with its peers on one
// PostgreSQL cluster, in one run: a raw unordered INSERT, the same INSERT
// under a global advisory lock, and watermill-sql v4's PostgreSQL publisher
// and subscriber. It prints throughput ratios to annals and, beside them, a
// correctness check: a tailing reader that counts skipped events while 16
// writers append and an unrelated writing transaction is held open. When the
// server runs on this machine, it also prints the CPU time each appended
// event cost the server and the appending processes.
//
// It is a module of its own so that the annals library gains no dependency
// on its peers. Run it with `make bench-peers` from the repository root (a
// throwaway cluster with fsync on), or with DATABASE_URL set:
//
//	cd bench/peers && go run . [-rounds 3] [-duration 3s] [--output json]
//
// See docs/benchmarks.md ("Peers") for what each figure measures.
package main
