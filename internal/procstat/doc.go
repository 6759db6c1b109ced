// Package procstat reads processes' status from Linux's /proc: each
// process's state, parent, process group and CPU time (ReadStat, PIDs), a
// local PostgreSQL server's CPU time over all of its processes (Server),
// and this process's CPU time (Self, from getrusage).
//
// pgcluster uses it to wait for a killed server's processes to be gone.
// Benchmarks use it because a rate moves with whatever else a shared
// machine runs while the CPU time each event costs stays put: "annals bench
// --only append" and bench/peers report both (docs/benchmarks.md, "CPU per
// event").
//
// A server's CPU time is the sum of its postmaster's own, of what the
// postmaster's ended children used (the postmaster waited for them, so the
// kernel adds their times to its cutime and cstime) and of what every
// running child has used so far. Two readings bracket a measurement; their
// difference covers backends, the WAL writer, the checkpointer and any
// connection that came and went in between. A running process's time is
// read from /proc/PID/schedstat (nanoseconds) where the kernel keeps it,
// from /proc/PID/stat (USER_HZ ticks, 10 ms) otherwise; ended children's
// times come in ticks only.
package procstat
