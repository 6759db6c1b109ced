// Package relay publishes the event log to NATS JetStream, exactly once and
// in order, so that other services, regions and non-Go consumers read it
// from the distributed log they already run (annals relay nats; package
// natsconsumer for Go services on the other side).
//
// # How a relay runs
//
// A Relay is a subscriber like any other: Run registers its processor
// with a projection.Runner (RegisterProcessor) under Config.Name, so one
// relay of a name leads cluster-wide (the md5-keyed advisory lock),
// standbys take over when it dies, its checkpoint is fenced by the
// leadership's epoch, and the process registers as a runner instance
// (annals status shows its leader and lag). It is woken by NOTIFY or, with
// Config.WAL, by its own logical replication slot (package walsource);
// either way it reads its batches from the events table, filtered by
// Config.Types globs.
//
// For each batch it:
//
//  1. publishes every event the stream does not hold yet, pipelined
//     (PublishMsgAsync), to the subject the template makes (default
//     "<prefix>.<event type>.<stream id>", each value escaped into one token
//     by EscapeToken: bytes other than ASCII letters, digits, "-" and "_"
//     become "%XX", so "order.placed" is the token "order%2Eplaced"), with
//     headers: Nats-Msg-Id = the event ID, Nats-Expected-Last-Msg-Id = the
//     ID of the event published before it (the first message into an empty
//     stream: Nats-Expected-Last-Sequence = the stream's last sequence as
//     the leadership's start read it), and the Annals-* headers
//     (position, event ID, stream ID, stream version, type, recorded at,
//     correlation and causation IDs, the whole metadata; a stream ID, type
//     or relay name with white space at either end, which NATS would trim,
//     also as a JSON string in Annals-Stream-Id-Json, Annals-Event-Type-Json
//     or Annals-Relay-Json) and the W3C
//     trace context (traceparent, tracestate); the body is the event's data
//     as stored;
//  2. collects the acknowledgements of the batches before it, in order
//     (waiting up to AckTimeout), and those of its own that are in: a batch's
//     acknowledgements are awaited while the next batch is published;
//  3. every CheckpointInterval (and whenever the relay goes idle, waiting
//     for every acknowledgement first, and when it stops) commits the
//     checkpoint through the last event of the unbroken run of
//     acknowledgements, fenced by the epoch. The checkpoint never passes an
//     event JetStream has not stored.
//
// # Why exactly once
//
// Nats-Expected-Last-Msg-Id chains the messages: JetStream stores a message
// only if the newest message it holds is the relay's previous event. So
// whatever is lost (a publish in a dying connection, a server restart) or
// re-sent (the client's reconnect buffer, a retry), the stream holds a
// prefix of the relay's sequence: no event twice, none out of position
// order, so each stream's events in version order. A message the stream has
// already stored is dropped as a duplicate by its Nats-Msg-Id before the
// chain is checked (JetStream checks de-duplication first), which makes a
// re-publish within the duplicate window a no-op.
//
// A relay does not even rely on the window: at the start of each leadership
// and after any failed publish it reads the newest message of the stream
// (its Annals-Position header) and skips every event at or below it,
// counting them as acknowledged (its checkpoint may move past them). A
// leader that published and died before its checkpoint committed leaves
// events the next leader finds there and does not publish again, however
// long the takeover took. The duplicate window (Config.Duplicates, default
// 10 minutes, which must exceed the longest takeover) is a second line of
// defence for the messages in flight at the moment of a takeover.
//
// The skip needs the newest message still in the stream: a relay that
// published, was acknowledged and died before its checkpoint committed,
// and stayed down until Config.MaxAge removed every message of the stream,
// finds nothing to skip by, and its successor publishes those events again
// (past the duplicate window too). Keep MaxAge (default: none) well above
// the longest outage of every relay process.
//
// The skip also needs the stream to keep what it acknowledged. JetStream
// acknowledges a message before it writes it to disk (sync_interval, 2
// minutes by default), so a crash of the server's machine, or its store
// restored from a backup, loses the newest messages: the stream's newest
// message is then below the relay's checkpoint. So it is for other reasons
// (a relay of some types moves past the events of others; an operator moves
// it past an event NATS refuses), and the log cannot tell them apart; the
// stream can. With each checkpoint commit, in the same transaction and
// fenced as it is, the relay records the JetStream sequence of the last
// message acknowledged and the stream's name and creation time (table
// relay_acks). At the start of each leadership, when the stream's newest
// message is below the checkpoint and the stream is the one recorded with a
// last sequence below the recorded one, it lost what it had acknowledged:
// the relay logs an ERROR, moves its checkpoint back to the stream's newest
// message (fenced by the epoch, and only from where the leadership found
// it) and publishes from there, chained on that message: each lost event
// once, in order. An event NATS refuses for good (for its size: over
// max_payload or the stream's max_msg_size, headers over 64 KiB, over the
// file store's 32 MiB record) up to where the leadership found the
// checkpoint is one an operator moved the relay past, or one the stream
// had stored under a limit lowered since: refused now does not tell which.
// A count does. The sequence the stream had acknowledged is recorded with
// the move back: that less the stream's last sequence is the lost messages
// left to publish again, and the events left up to where the refill ends
// outnumber them by the events an operator moved past. While there is such
// a surplus, the event is passed over again, with a WARN; with none, the
// stream had stored it, and the refill stops there, with an ERROR naming
// the limit to raise (moving the relay past it leaves it out of the stream
// for good). The count tells how many were moved past, not which: a refill
// meeting both a stored event under a lowered limit and a skip after it
// passes over the first and stops at the second. The relay checks these
// limits before it sends an event of a refill (the connection's
// max_payload, the stream's max_msg_size and storage as the leadership
// read them), so no message is chained on one the stream refuses (on a
// replicated stream, its successors would be refused as duplicates "in
// process" until the duplicate window passed); a refusal it did not
// foresee comes with the acknowledgements, and the messages after the
// event, in flight, chained on it, are published again chained on the
// stream's newest message. Where the refill ends, and that sequence, are
// recorded with the move back (relay_acks.refill_to and refill_seq,
// migration 0037) and cleared by the commit that reaches its end, so that
// a refill spanning leaderships (a failed publish, a restart) goes on. On
// a schema before 0037 (or 0043, see "A rewound log") the relay fails at its start (EnsureStream), and
// each leadership, with migrations.ErrNotMigrated: run annals migrate. Refusals
// of another kind (a stream full under discard-new limits, the account's
// resources) refuse every event alike until a limit is raised, and are
// waited out, not passed over; a publish the account may not make is not
// answered at all (only the connection is told), which the relay cannot
// tell from a slow server. Nothing else moves the checkpoint back: a
// checkpoint an operator moved forward stays, types added to the relay are
// published from the checkpoint on, and a purge keeps the stream's last
// sequence. A relay with nothing recorded yet does not move back.
//
// A stream that lost what it acknowledged and holds nothing now (the rest
// removed since by MaxAge or a purge, or its store restored from before
// the relay's first publish into it) keeps its last sequence, below the
// one recorded, but no message to move back to: nothing tells which event
// was at that sequence (the relay records one sequence and position, at
// each commit, not every message's), and a guess would publish again
// events the stream had delivered or leave out some it lost, silently
// either way. The relay logs an ERROR naming the lost sequences and how to
// publish them (the stream made anew from position 0; see "The stream"),
// once per stream and loss in a process, and publishes from its checkpoint
// on. Keep what JetStream acknowledges with sync_interval: always on the
// server, or a stream of three replicas (Config.Replicas).
//
// Hence the rules: one relay per JetStream stream (EnsureStream refuses a
// stream whose newest message another relay published, and the chain would
// break with two publishers; of two relays that both found a stream empty,
// the first message in breaks the other's expected last sequence), an unpartitioned relay subscription (one
// publisher in order), and limits retention (interest or work-queue
// retention would delete what the chain and the skip read).
//
// # Whose stream
//
// The skip trusts the newest message's position only if it is a position of
// this relay's log: a relay of another database or schema, with the same
// name (the default, "relay"), would otherwise take the other log's newest
// position as published and skip its own events up to it, silently. So
// every message carries the log's origin (Annals-Origin: the cluster's
// system identifier, the database and the schema) besides the relay's name
// (Annals-Relay), the stream EnsureStream creates carries both in its
// metadata (MetadataRelay, MetadataOrigin), and EnsureStream and each
// leadership refuse (ErrStreamMismatch) a stream whose metadata or newest
// message names another relay or origin, whose newest position is above
// this log's head, or whose newest message's event ID is not that of this
// log's event at its position (one index probe): the position alone holds
// only while this log is the shorter, and neither tells a log that lost
// its newest events (an asynchronous failover) and appended others at
// their positions. Messages of relays older than the origin header have
// none; their event ID decides, and where this log no longer holds the
// event (scavenged by retention) such a newest message is taken as this
// log's when its position is within the head (logged as a warning until
// the relay publishes); a stream made by an older relay has no metadata
// and is judged by its messages. An origin read by a role that may not run
// pg_control_system has "0" for the cluster, which matches any cluster of
// the same database and schema. A database that took over a log (restored
// from a dump, upgraded with pg_upgrade, which changes the system
// identifier, or renamed) adopts the stream once with Config.AdoptStream.
//
// # A rewound log
//
// A database restored from a backup, or failed over to an asynchronous
// replica that lacked its newest commits, is the log as it was: the events
// after that are gone, and their positions go to new events. The relay's
// stream then holds events the log lost, and the refusals above tell: its
// newest message is past the log's head, or, once the log has grown past
// it, another event than the log's at its position. The stream is to be
// made anew (delete it, set the checkpoint to 0, start the relay). Its
// consumers (package natsconsumer) keep the last position they handled,
// and a consumer past the point where the old stream and the log part
// handled events the log lost; in the new stream it would take the new
// events at or below its position for those it handled and pass over them.
// So when the refusal comes from a message of this relay and this log's
// origin (or an adopted one), the relay finds where they part: the last
// message of the stream whose event ID is that of the log's event at its
// position, by binary search over the stream's sequences (the stream is in
// position order; about log2(messages) reads of a message and index probes;
// a position past the log's head counts as parted; one at or below it
// that the log holds no event at, scavenged by retention, tells nothing,
// and the next message is read instead: a run of such counts as parted,
// so a scavenged event can only make the answer lower; 0 when no message
// the stream still holds agrees). A message of another origin (a database restored from a
// dump into another cluster has another system identifier) counts when
// some of the stream's messages are this log's events: it is this log,
// rewound; a stream none of whose messages is this log's event is another
// log's, and nothing is recorded. The position found is recorded with the
// stream's name and creation time (relay_acks.rewinds, migration 0043: a
// JSON array, Rewinds), by the lowest found for one stream, beside every
// rewind found under an earlier stream, and the refusal says it. A log
// can be rewound more than once (restored at 100 under stream A, and
// again, once B was made and had grown, at 200 under B): a consumer placed
// in A at 150, offline through both, moves to the stream made after B's
// rewind, and only A's tells it that it handled lost events. So each
// stream EnsureStream creates after a rewind (at the start, or at a
// leadership that finds the stream gone) carries every rewind recorded in
// its metadata (MetadataRewinds: Rewinds.Stamp), logged at WARN, also when
// the relay process was restarted between the refusal and the stream's
// making (the record is in the database). A consumer that moves to such a
// stream judges its place by the rewinds found under the stream its place
// is in and those made after it, taking the lowest position
// (Rewinds.Since: rewinds under streams made before its place's are of a
// log its place does not come from): past it, it stops at once with
// natsconsumer.ErrLogRewound; at or below it, it goes on. The stamp is
// bounded: a rewind that agrees no further than one under a later stream
// is left out (that one stops every place it would), so what is left
// rises with each stream; past 32 (about 3 KB, 11 KB with 255-character
// stream names, against the 128 KB JetStream allows) the oldest two are
// taken as one with the lower position, which may stop a consumer placed
// between them that the full record would not, never the reverse. The
// record is kept (a stream made again later, lost by the server, carries
// the stamp too; consumers whose place is in a stream made after every
// one found rewound ignore it). A database restored from a backup taken
// before a rewind was recorded has lost that record with the rest. A
// rewind the relay did not see (the stream deleted before the
// relay ran against the rewound log) is not stamped: consumers then find
// it only when the new stream reaches their position with another event.
//
// # The stream
//
// EnsureStream first checks that the relay's schema is migrated (the
// tables and columns the relay uses): on a schema missing or not migrated
// it fails with migrations.ErrNotMigrated, saying to run annals migrate,
// before it looks at or makes any stream. It creates the stream
// (Config.Stream, default "ANNALS") with the
// template's subject filter (placeholders as "*": "annals.*.*"), limits
// retention, file storage, Config.MaxAge, DenyDelete and DenyPurge, and the
// duplicate window; an existing stream must take those subjects (one of
// its subjects covers the filter by NATS wildcard rules, token by token:
// "annals.*.*", "annals.*.>" or "annals.>" for the default), keep limits
// retention and de-duplicate at least as long. JetStream refuses a new
// stream whose subjects overlap another stream's (error 10065): a second
// relay, on a stream of its own, needs a subject prefix of its own
// (Config.Prefix) or subject template (Config.Subject), which the error
// says.
//
// A stream that is gone (deleted, or lost with the server's store) is made
// again, by EnsureStream when the relay starts or at its next leadership,
// and holds the events after the checkpoint on. When the checkpoint is past
// 0, EnsureStream logs so, with the way to publish the earlier ones: stop
// the relay, delete the stream, set the checkpoint to 0 and start it (only
// setting the checkpoint back would not do: the relay skips what the new
// stream's newest message shows published). So does a leadership that finds
// a stream of the name the relay recorded with its last commit but made at
// another time (deleted and made again by an operator, or by a server that
// lost its store: it holds none of the events up to the checkpoint), or
// the stream empty, never having held a message, under a checkpoint past 0
// (a stream made by hand), once per stream.
//
// # Failures
//
// A failed or unacknowledged publish (NATS down, a timeout after
// AckTimeout) commits what was acknowledged and ends the leadership (the
// engine's cursor has moved past the batches in flight, and only a new
// leadership starts again from the checkpoint); the relay stands by and
// claims again after RetryBackoff, re-reading the stream's newest message.
// A relay that is stopping waits for acknowledgements only while its NATS
// connection is up: stopped during an outage, it commits what was
// acknowledged and returns, rather than waiting out AckTimeout.
// A relay that lost its lease cannot commit (fencing) and stands by; the new
// leader starts from the checkpoint and the stream's newest message.
package relay
