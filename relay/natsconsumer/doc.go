// Package natsconsumer reads the events a relay (package relay) published
// to JetStream, as eventstore.Event values, in another service: Run hands
// each to a function (at-least-once), and RunProjection runs an annals
// Projection (the same Handle(ctx, tx, event) a Runner calls in the source
// database) over them in this service's database, exactly once.
//
// # Algorithm
//
// New creates (or updates) a durable pull consumer on the whole stream:
// explicit acknowledgements, deliver all, at most Batch unacknowledged.
// The relay makes the stream: with none by the name, New (and Run or
// RunProjection, at their start) fails with ErrNoStream, saying to start
// the relay first, rather than wait for a stream that a mistaken
// Config.Stream would never bring; once running, a consumer waits for a
// stream gone missing (below).
// Event-type globs (Config.Types) are applied here, not as a server-side
// filter, so that stream sequences arrive without gaps. Messages are
// fetched Batch at a time (a pull request that the server keeps open
// until Batch messages came or a second passed) and handled one by one in
// stream order, each as it arrives: an event on a live stream is handled
// within milliseconds of its publish, not when its pull request ends (up
// to a second later). Each is decoded from its headers
// (relay.Decode) and upcast with Config.Registry.
//
// RunProjection keeps a checkpoint in the service's database
// ("<schema>.relay_checkpoints": consumer, stream sequence, the stream's
// creation time, and the position of the last event handled) and commits
// it in the handler's transaction, so the projection's writes and the
// checkpoint land together; the message is acknowledged after the commit.
// Run keeps its place in memory, starting from the consumer's
// acknowledgement floor (messages are acknowledged in order). A message at
// or below that place (re-delivered because the ack was lost) is
// acknowledged without being handled. A message further than one past it
// means that the messages before it are unacknowledged somewhere: a
// process fetched them and died, and the server re-delivers them only after
// AckWait, behind what it delivers meanwhile. The consumer then reads the
// missing messages from the stream by sequence (a request each) and handles
// them first; their re-deliveries arrive later, at or below its place.
// When no delivery comes after them (the process died holding a full
// batch, Batch messages: the server lets no more out unacknowledged and
// delivers nothing newer until AckWait; or nothing was published since),
// a fetch comes back empty instead. A consumer that found messages
// unacknowledged on the server at its start (or read some by sequence)
// then asks the server about its durable consumer: what it delivered past
// the place is read by sequence, and, while it holds a full batch
// unacknowledged, so is what the stream holds after that, Batch at a time.
// So is a RunProjection checkpoint behind what the durable consumer
// delivered (and had acknowledged): its row deleted to rebuild the read
// model, or the service's database restored from a dump older than the
// acknowledgements. The server delivers those messages no more; the
// consumer, seeing them delivered past its place at its start (or when it
// makes its durable consumer again), reads them by sequence at once,
// without waiting for a new message to show them missing.
// Otherwise an empty fetch costs nothing more: a consumer nobody else holds
// messages of makes one request per fetch, idle or not, and reads nothing
// by sequence. Together: each event's effect once (RunProjection) or at
// least once (Run), in stream order, which is the relay's position order,
// without waiting for AckWait after a crash. (A process that fetched a
// full batch after the next one had started, two at a time, leaves that
// one waiting for AckWait, as before.)
//
// Messages the stream no longer holds when the consumer gets there
// (removed by MaxAge, MaxMsgs, MaxBytes or MaxMsgsPerSubject, or deleted)
// are reported to Config.OnGap, one Gap for each run of consecutive
// missing messages however long (first and last stream sequence, count,
// the last position handled before them), before anything after them is
// handled; a run costs one read (the stream's first message at or after a
// sequence). By default it logs them at ERROR level and the consumer passes
// over them; an OnGap that returns an error stops Run or RunProjection with
// it, the place left before the gap: the next RunProjection reports it
// again, and so does the next Run unless the server moved the consumer's
// acknowledgement floor past it meanwhile (it does once the stream has
// removed the messages delivered after the gap too; see Config.OnGap).
//
// The relay makes its stream again when it is gone (deleted, or the
// server's store lost), and the new stream numbers its messages from 1. At
// its start, and whenever a fetch finds the stream or the durable consumer
// gone (or a read finds the stream made again), the consumer looks the
// stream up by name and creates its durable consumer on it again. While
// that fails (the stream missing until the relay makes it again) it tries
// again after RetryBackoff, doubled each time up to 5 s, and logs at WARN
// ("the relay's stream is missing") at the first failure and then at most
// once a minute (DEBUG between), at INFO when found again. A stream
// made after the one its place belongs to (creation times differ; a
// checkpoint saved before they were kept counts as of the current stream)
// is read from its start, with a WARN: events the old stream held after the
// last position handled, if any, are not in the new one (the relay
// publishes from its checkpoint on). Its events at or below the last
// position handled (published again, the relay's checkpoint set back) are
// acknowledged without being handled: within one stream, stream order is
// position order, so this passes over no new event, unless the log itself
// went back: a source database restored from a backup, or failed over to a
// replica that lacked its newest events, gives the positions of the events
// it lost to new ones. The relay, finding its stream past such a log,
// records the last position at which the two agree, with every rewind it
// found before, and stamps them into the stream it makes anew
// (relay.Rewinds: metadata annals-rewinds, each stream found rewound by
// name, creation time and agreed position; see the relay package, "A
// rewound log"). So a consumer moving to a stream made again first reads
// its stamp: of the streams found rewound that were made no earlier than
// the one its place is in (that one, or later ones: a log restored twice
// is found rewound under two streams, and a consumer offline through both
// moves from the first to the stream made after the second), it takes the
// one that agrees least far (relay.Rewinds.Since); when its last position
// handled is past that one's, it has handled events the log no longer
// has, and the stream's new events at or below its position would be
// passed over. Run or RunProjection stops at once with
// ErrLogRewound (a *RewoundError with Stamped set, Agreed the agreed
// position, Position and Handled the consumer's place), logged at ERROR,
// before it reads, acknowledges or passes over any message of it. (A Run
// or RunProjection that finds the new stream while running stops before
// it makes its durable consumer there; on a restart, New, which knows no
// place yet, has made it on the new stream already, and it stays there
// with nothing delivered or acknowledged.) RunProjection's checkpoint
// stays, so the next start stops there again: rebuild the read model. A consumer at or below the agreed position goes on as above. As
// a second line (a stream made anew without a stamp: the relay never saw
// the rewound log, or an older relay), the consumer keeps the ID of the
// last event handled beside its position (RunProjection in its checkpoint
// row), and an event at that position with another ID stops Run or
// RunProjection with ErrLogRewound (*RewoundError, Stamped false), logged
// at ERROR, before that event; the new events below that position were
// passed over by then, and nothing tells before the new log reaches it (or
// at all, if the position is a hole in the new log: an append rolled
// back). A checkpoint saved before the stream's creation time was kept,
// and a Run started after the stream was made again (its place is the
// new durable consumer's), see no stream change and no stamp.
//
// RunProjection first runs the projection's read-model setup
// (Typed.OnSetup, projection.Setupper) in the service's database as a
// projection.Runner does (projection.EnsureSetup): once per version per
// database, under the projection's setup lock, recorded in
// "<schema>.read_model_setups". A projection with a setup so needs the
// annals schema migrated in that database (annals migrate); without it
// RunProjection fails with migrations.ErrNotMigrated. A projection without
// one needs only the checkpoint table, which RunProjection creates.
//
// RunProjection creates the checkpoint table (and its schema) only when it
// is missing or lacks a column: then in one transaction under an advisory
// lock on the schema's key (internal/lockkey, schema +
// ":relay-checkpoints"), so consumers that start at once on a database
// without it (replicas in a rollout, a service's projections) make it one
// after the other; PostgreSQL's CREATE ... IF NOT EXISTS alone fails for
// the loser of a concurrent creation. When the table is there with every
// column it runs no DDL: a role that may not create (USAGE on the schema,
// SELECT, INSERT and UPDATE on the table, which its owner made) runs it.
//
// A failed handler is retried in place after RetryBackoff (the message is
// kept from re-delivery meanwhile); the events after it wait. It is
// retried for ever, each failure logged at WARN ("handling a relayed event
// failed; retrying"): there is no retry limit, no dead-letter table and no
// skipping (unlike a projection.Runner), since passing over an event would
// break the order the consumer keeps; alert on the WARN. An error marked
// failure.Permanent (the mark a projection.Runner dead-letters at once;
// a typed projection marks an event it cannot decode so) is not retried:
// it stops Run or RunProjection, as an OnGap error does, logged once at
// ERROR ("handling a relayed event failed permanently") and returned as
// a *HandlerError (errors.Is matches ErrHandlerFailed and the handler's
// error; it names the event: stream sequence, position, ID, type). The
// place is left before the event: it is handed back (Nak) unacknowledged
// with the fetched messages after it (those its fetch still brings too, as
// on shutdown, below), and RunProjection's transaction is
// rolled back, its checkpoint unmoved, so the next Run or RunProjection
// starts at that event again; fix the handler (or the event's data)
// first.
//
// On shutdown (ctx ends) Run and RunProjection return at once, without
// waiting for the open fetch to end. Its pull request stays open on the
// server until it expires (a second after it was made; nats.go gives up on
// it a second after that) and the server delivers to it meanwhile: a
// goroutine takes those messages and, when the pull request ends, hands
// them back (Nak) with the fetched but unhandled ones, so they are
// delivered again within a second or two rather than after AckWait. Until
// then they count as delivered, unacknowledged: a consumer started on the
// durable consumer meanwhile reads them from the stream by sequence, as
// after a crash (above). After a crash the server re-delivers the
// messages the process held after AckWait (default 30 s), and the next
// consumer has read them from the stream already (above).
//
// An acknowledgement that fails after the event was handled (committed,
// for RunProjection; the NATS connection lost, say) is not the handler's
// failure: it is logged at WARN ("acknowledging a relayed event failed
// after it was handled") and the consumer goes on, the event not handled
// again; the server delivers the message again after AckWait, and it is
// then at or below the place. A RunProjection COMMIT whose answer was lost
// (the connection failed at COMMIT, the commit landed) is retried as a
// failed handler is, and the retry's checkpoint save, forward only,
// changes nothing: RunProjection then reads the checkpoint in the same
// transaction, finds it at or past the event in the same stream, rolls
// back (the projection's second pass discarded), logs a WARN ("the
// checkpoint holds this relayed event already") and takes the event as
// handled. Any other checkpoint found there fails the event with "moved
// under us", saying what the checkpoint holds.
//
// One RunProjection per durable consumer at a time: run it in one process,
// or leader-elected (a projection.Service in a Runner of this service's
// own annals database is one way).
package natsconsumer
