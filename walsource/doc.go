// Package walsource follows the event log through PostgreSQL's logical
// replication (the pgoutput plugin, via github.com/jackc/pglogrepl) instead
// of NOTIFY: a live source of committed events that wakes subscribers and
// feeds the NATS relay (package relay).
//
// # Pieces
//
//   - A publication "<schema>_events" on the events table, inserts only
//     (EnsurePublication creates it on first use, one process at a time
//     under an advisory lock, so replicas starting at once all start; the
//     events table is append-only, so inserts are all there is).
//   - A replication slot per consumer: per subscriber partition, named by
//     SlotName from the database, schema, subscriber and partition (slot
//     names are cluster-wide). Only the partition's leader streams from it,
//     so "one slot, one walsender" matches "one leader cluster-wide".
//   - A Source streams the slot on a replication connection
//     (replication=database), decodes pgoutput protocol 1 (Relation, Begin,
//     Insert, Commit) into eventstore.Event values, and hands each
//     transaction that appended events to OnCommit, in commit order, which
//     is position order (package eventstore serializes the numbering).
//
// # Confirming
//
// A slot keeps every WAL record from its confirmed position on, and sends
// everything after it again when a stream starts. The Source therefore
// confirms (standby status update: write = flush = apply) only through the
// end LSN of the last transaction whose events are all at or below the
// position the consumer's checkpoint holds (Config.Confirmed, read every
// StatusInterval while something received is unconfirmed). When nothing
// received is unconfirmed, it confirms through the server's end as the
// walsender's keepalives report it (the position it has decoded through,
// so no transaction with events before it is unsent): other tables' writes
// then do not pile up behind an idle slot.
//
// So a consumer that is down, crashed, or slow loses nothing: its slot
// retains the WAL of every transaction it has not checkpointed, and the next
// stream starts there. The price is the operator's to watch: a slot whose
// consumer never comes back retains WAL until it is dropped (DropSlot) or
// max_slot_wal_keep_size invalidates it (docs/operations.md).
//
// An invalidated slot (wal_status lost) can never be streamed again: its
// start fails with SQLSTATE 55000. The Source then drops it and creates it
// again, logging one warning with PostgreSQL's DETAIL, and streams from the
// new slot. That slot starts at the current WAL position, so the commits in
// between are not sent; OnStreaming(true) follows as after any reconnect,
// and a consumer reads what it missed from its own checkpoint (Wake's
// engine reads from the events table, so it loses nothing).
//
// # Reconnecting and failover
//
// Run reconnects with backoff (100 ms doubling to 1 s, jittered) after any
// failure: a killed walsender, a PostgreSQL restart. Each stream starts from
// the slot's confirmed position, so commits received but not confirmed on
// the last stream are received again: consumers skip positions they have.
// When a slot is still active for another session (a former leader's
// process that lost its lock but not yet its connection), the new stream
// fails with "object in use"; the Source ends that session
// (pg_terminate_backend on the slot's active_pid) and tries again. The
// caller holds the subscriber's lock, so that session is stale.
//
// A failure that retrying cannot mend ends Run instead, with a
// *PermanentError, logged once at ERROR with what to do about it: a role
// without the REPLICATION attribute (42501), or one that may not create
// the publication; wal_level below logical, max_replication_slots or
// max_wal_senders 0 (55000, 53300, told from their passing namesakes by
// reading the settings); a login refused (28000, 28P01); a database that
// does not exist (3D000); the output plugin missing (58P01). Wake.For's
// Waker then stops signalling (StoppingWaker), the engine polls at its
// PollInterval, and Wake.Err reports the failure; the next leadership
// tries again.
//
// # Waking subscribers
//
// Wake.For is a catchup.WakeFor (projection.Config.Wake): each live
// leadership of a subscriber partition runs a Source on the partition's slot
// with Confirmed reading the partition's checkpoint, and signals the
// engine whenever a transaction appended an event its filter matches in its
// partition, at every (re)connect, and WakeConfig.AdvanceAfter (1 s) after
// any decoded commit at the latest, once for all the commits of that span.
// The partition is computed as the engine's read computes it
// (annals.stream_partition of the stream ID or its category) when the
// subscriber is partitioned by stream or category and the server encoding
// is UTF8; partitioned by a metadata field, whose text PostgreSQL renders
// from the JSON, an event of any partition signals every partition (an
// empty read for the others). The AdvanceAfter wake is for the commits the
// filter or the partition leaves out: they signal nothing, and the
// slot is confirmed only as the checkpoint passes them, so while only such
// commits came, the partition's checkpoint would stay behind them,
// and its slot would retain the WAL written since, until the next poll.
// Woken, the engine reads, finds nothing, and moves its checkpoint to the
// head; the slot's confirmed position follows within a StatusInterval.
// (It also covers a signalled commit whose read came a moment before the
// commit was visible.) The engine still reads its batches from the events
// table: the signal carries no data the engine relies on, so the table
// stays the one source of truth for exactly-once processing, fencing,
// filters, partitions and dead letters, and a lost signal costs at most a
// poll interval. What the WAL changes is who wakes the subscriber: a
// committed transaction, decoded, rather than a NOTIFY that every append
// must send (and that serializes commits on a global lock). When every
// consumer of a database follows the WAL, appends need not NOTIFY; see
// docs/benchmarks.md for the figures.
//
// # Latency and synchronous_commit
//
// A walsender sends a transaction only once its commit record is flushed
// to disk. With synchronous_commit on (PostgreSQL's default) the commit
// flushes it itself, and the wake-up follows within a few milliseconds,
// like a NOTIFY. With synchronous_commit off for the appends (the clusters
// of `annals dev --fsync=false`, internal/pgcluster and
// annalstest/pgcontainer run so), the WAL writer flushes it on its own
// schedule: up to about twice wal_writer_delay (200 ms by default) after
// the commit. Measured on such a cluster: medians of 25 to 200 ms and
// maxima around 400 ms from append to handler, against 3 to 5 ms with
// synchronous_commit on; NOTIFY, sent at commit, took a few ms either way.
// Tests that time the WAL wake-up on such a cluster must allow for that,
// or turn synchronous_commit on for their database.
//
// Costs: one walsender and one slot per led subscriber partition, each
// decoding the whole WAL stream of the database (pgoutput filters by
// publication after decoding). It suits a few subscribers (the relay, a
// latency-critical projection), not hundreds of partitions: those stay on
// NOTIFY.
package walsource
