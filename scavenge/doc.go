// Package scavenge removes the rows of events that no stream read returns
// any more: the events of hard-deleted streams, and every event below its
// stream's truncate_before (deleted streams, explicit truncation), beyond
// its stream's maximum count or older than its maximum age (see
// eventstore.Store.DeleteStream and SetStreamRetention); and the aggregate
// snapshots built from them.
//
// # Algorithm
//
// The work is done by the SQL function scavenge(instance, now, batch), one
// batch per call and per transaction. A call finds the open run in
// scavenge_runs or starts one (range: the oldest stored position to the
// head at that moment; retention clock: now, or the server's clock if that
// is earlier: a caller can make a run remove less, never more), removes
// the expired events whose positions lie in the next batch of positions,
// and records the step (scanned_to, removed, steps) in the same
// transaction. With the events it removes the snapshots (package
// aggregate) of their streams at or below the highest version it removed
// or folding from a version it removed, and every snapshot of a
// hard-deleted stream: state built from removed events does not outlive
// them. A step holds the forget lock shared (forget_subject holds it
// exclusively), so a step and a Forget take turns instead of deadlocking. A run is
// therefore resumable: if the process dies (SIGKILL, a lost connection)
// the step in flight rolls back, and the next call, from any process,
// continues the run where its last committed step left it. Events appended
// after a run started are left to the next run.
//
// The events table's append-only trigger lets a DELETE through only in the
// transaction of a scavenge step (recorded in scavenge_runs, which only the
// function writes); scavenge() runs as the schema's owner, and roles get
// EXECUTE on it through `annals grant operator`. Steps take an advisory
// lock that retention changes (set_stream_retention) take in shared mode,
// so a step never removes an event that a retention change committed before
// the step keeps. Removing events from the log does not change the order
// of the rest: a reader that has seen position N has still seen every
// remaining event below N.
//
// # Leadership and throttling
//
// A Scavenger takes a session advisory lock ("<schema>:scavenger", see
// package advisorylock) on a connection of its own before a run and makes
// every step on that connection: one scavenger per schema runs at a time,
// and one that lost its lock cannot make another step. RunOnce fails with
// ErrBusy when another holds the lock. Run, the service form (a
// projection.Service: Runner.AddService("scavenger", s)), starts a run
// every Interval, in whichever process wins the lock. Between steps it
// pauses for Pause, so that a large run does not saturate the database;
// OnProgress is called after every step.
package scavenge
