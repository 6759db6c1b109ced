// Package archive moves old events out of the hot events table into
// events_archive, so that the table that every append and every live
// subscriber touches, and its indexes, stay small however long the log
// grows. Archived events stay readable: ReadAll and ReadStream, aggregate
// loads, subscriptions and rebuilds from position 0, the CLI and the console
// read them through the view events_all (the two tables, their indexes
// merged in position or stream-version order). Appends keep answering
// re-appends of archived event IDs as idempotent, and refuse other events
// with an archived ID, as for hot events.
//
// # Algorithm
//
// The archive is a contiguous prefix of the log, up to the horizon: every
// position below it is archived (or scavenged), every position at or above
// it is in events. The work is done by the SQL function archive(instance,
// before, batch), one batch of positions per call and per transaction. A
// call finds the open run in archive_runs or starts one (range: from the
// horizon to before - 1, but never the newest event, which stays hot), then
// moves the next batch of positions in one statement (DELETE ... RETURNING
// from events feeding an INSERT into events_archive), and records the step
// (archived_to, moved, steps) in the same transaction. Every snapshot sees
// an event in exactly one of the two tables. A run is resumable: if the
// process dies (SIGKILL, a lost connection) the step in flight rolls back
// and the next call, from any process, continues the run where its last
// committed step left it. Only positions below an event that was visible
// when the run started are moved: positions are commit order, so every
// lower position is committed by then and nothing in flight is archived.
//
// The events table's append-only trigger lets a DELETE through only in the
// transaction of a scavenge or archive step (recorded in scavenge_runs or
// archive_runs, which only the functions write); events_archive takes
// INSERTs only from an archive step and DELETEs only from a scavenge step.
// archive() runs as the schema's owner; roles get EXECUTE on it through
// `annals grant operator`.
//
// An archive step holds the append lock while it moves events, so appends
// wait for the step (keep batches small: the default is 2000 positions), and
// the lock of scavenge steps, which then never overlap with it. Holding the
// append lock is what keeps idempotency by event ID exact: an append looks
// its event IDs up in both tables, and no step can move an event between
// that look-up (made under the append lock, or made again under it when a
// step ran in between) and the append's INSERT.
//
// # Leadership and throttling
//
// An Archiver takes a session advisory lock ("<schema>:archiver", see
// package advisorylock) on a connection of its own before a run and makes
// every step on that connection: one archiver per schema runs at a time,
// and one that lost its lock cannot make another step. RunOnce fails with
// ErrBusy when another holds the lock. Between steps it pauses for Pause;
// OnProgress is called after every step.
package archive
