// Package benchmark measures annals against raw PostgreSQL doing the same
// work in the same run, so that the figures survive a noisy machine: what
// matters is the ratio, not the absolute number.
//
// Append (append.go): events/s for 1, 4 and 16 concurrent writers appending
// 1 or 100 events per transaction, beside (a) a plain INSERT of the same rows
// numbered by a sequence with no ordering lock and (b) the same INSERT under
// a transaction-scoped advisory lock, each one statement per transaction in
// one round trip. The three run in interleaved rounds (3 by default): a
// round measures every combination once, its contenders' order rotating
// from one combination and one round to the next, so that none always runs
// first (on fresh tables, right after a checkpoint) or last; each figure is
// the median of its rounds, and each round's ratio is kept beside it.
//
// Catch-up (catchup.go): a fresh log of N events read from the start, 500 at
// a time, by a raw paged SELECT scanning payloads into []byte, the same with
// a checkpoint UPDATE per page, and a no-op Projection and a no-op Observer
// through projection.Runner.RunUntilCaughtUp, with the default telemetry and
// with it off; 3 interleaved rounds, medians, ratios and the client's CPU
// time per event. BenchmarkCatchup runs the same contenders for profiling.
//
// Latency (latency.go): from the moment an event is handed out, when due
// (Store.Append is called then when a writer is free), to the start of a live
// Observer's Handle, at fixed append rates, beside a raw INSERT + NOTIFY in
// one transaction read by a raw LISTEN connection; p50, p99, max and ratios,
// and the appends' own durations. The load is an open loop: every event is
// due at start + i/rate and handed out at the generator's first tick after
// that, to the next free writer, so a late tick does not lower the offered
// rate, and time an event waits for a free writer counts in its latency.
// It starts with a CHECKPOINT (when allowed), so that a checkpoint left by
// earlier writes does not end inside a measurement, and the two contenders
// take turns going first at successive rates.
//
// Takeover (takeover.go, child.go): two runner processes (the annals binary
// re-executed as a hidden command) share a subscriber; the leader is killed
// with SIGKILL (20 times by default) and the time until the standby has
// claimed the checkpoint is taken, per LockRetryInterval (the default alone by
// default), then the same after graceful stops, beside a raw waiter blocked in
// pg_advisory_lock getting the dead holder's lock.
package benchmark
