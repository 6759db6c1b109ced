// Package ratelog keeps the log of a condition that lasts readable: a
// failure that repeats while an outage lasts (a read replica down, a NATS
// server stopped, a grant taken away) would otherwise log a WARN at every
// retry, two a second for an hour.
//
// A Run is one run of such a condition. Its caller reports each
// occurrence (Failed) and logs it at the level Failed returns, and reports
// the first success after them (Recovered), which it logs at INFO:
//
//   - the first occurrence of a run: WARN;
//   - an occurrence within Every (a minute) of the run's last WARN: DEBUG,
//     with what the caller says of the run so far (Count, For);
//   - the first occurrence Every or more after the last WARN: WARN again;
//   - with FailedWith, an occurrence whose cause is not the last WARN's:
//     WARN;
//   - a success after a run: INFO, with how many occurrences it had and
//     how long it lasted (Recovered); a success with no run: nothing.
//
// With Gap set, an occurrence more than Gap after the one before it starts
// a new run (its WARN), and a success more than Gap after the last
// occurrence ends the old run without a line: the run ended unseen.
//
// The caller keeps its messages and attributes: the package decides the
// levels and keeps the count and the times, by a clock (Run.Now) that
// tests replace, so that they need not wait a minute of wall time.
package ratelog
