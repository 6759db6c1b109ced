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
// Event-type globs (Config.Types) are applied here, not as a server-side
// filter, so that stream sequences arrive without gaps. Messages are
// fetched Batch at a time and handled one by one in stream order; each is
// decoded from its headers (relay.Decode) and upcast with Config.Registry.
//
// RunProjection keeps a checkpoint in the service's database
// ("<schema>.relay_checkpoints": consumer, stream sequence) and commits it
// in the handler's transaction, so the projection's writes and the
// checkpoint land together; the message is acknowledged after the commit.
// A message at or below the checkpoint (re-delivered because the ack was
// lost) is acknowledged without being handled. A message further than one
// past the checkpoint is refused (Nak) until the ones before it come back,
// unless the stream no longer holds those (aged out by MaxAge). Together:
// each event's effect once, in stream order, which is the relay's position
// order.
//
// A failed handler is retried in place after RetryBackoff (the message is
// kept from re-delivery meanwhile); the events after it wait. On shutdown
// the fetched but unhandled messages are handed back (Nak) at once; after a
// crash the server re-delivers them after AckWait (default 30 s).
//
// One RunProjection per durable consumer at a time: run it in one process,
// or leader-elected (a projection.Service in a Runner of this service's
// own annals database is one way).
package natsconsumer
