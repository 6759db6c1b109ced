// Package eventstore appends domain events to the annals log and reads them
// back.
//
// The log is the events table of the annals schema (see package migrations).
// Every event belongs to a stream (an aggregate instance, say "order-42") and
// has a version in it (1, 2, 3, …) and a position in the whole log, its
// global sequence. Positions are commit order: a reader that has seen
// position N has seen every committed event below N, however many writers
// append at once, whatever their transactions do. That is what lets a
// subscriber keep a single number as its checkpoint.
//
// # How positions become commit order
//
// Appends go through the SQL function append_events, which takes a
// transaction-scoped advisory lock before it numbers its events and holds it
// until commit. PostgreSQL makes a committing transaction visible before it
// releases its locks, so the next append can only number its events after
// the previous one is visible. Only the numbering is serialized: the rest of
// a transaction runs concurrently. To keep the lock short, an append should
// be the last statement of its transaction. Append (its own transaction) and
// Transact (the caller's work first, then the appends and COMMIT in one
// round trip) arrange that; AppendTx leaves it to the caller.
//
// # Appending
//
//	reg := eventstore.NewRegistry()
//	eventstore.MustRegister[OrderPlaced](reg, "order.placed")
//	store, err := eventstore.New(pool, &eventstore.Config{Registry: reg})
//	res, err := store.Append(ctx, "order-42", eventstore.NoStream,
//		eventstore.NewEvent(OrderPlaced{Total: 100}))
//
// The expected version is optimistic concurrency: Any, NoStream,
// StreamExists or Exact(n). When it does not hold, the append fails with an
// error that matches ErrWrongExpectedVersion and carries the actual version
// (*WrongExpectedVersionError). Every event has an ID (a UUIDv7 unless the
// caller sets one); re-appending events whose IDs are stored already, with
// the same stream, type and data, returns the stored positions and writes
// nothing, so a client may retry an append whose outcome it did not learn.
//
// # Reading
//
// ReadStream and ReadAll return iterators that page through the table:
//
//	for e, err := range store.ReadStream(ctx, "order-42", 1) {
//		if err != nil { return err }
//		placed, err := eventstore.Decode[OrderPlaced](reg, e)
//		…
//	}
//
// # Errors
//
// Bad input fails with ErrInvalidEvent before anything is sent: a stream ID
// or type that is empty, only whitespace, over its byte limit
// (MaxStreamIDBytes, MaxEventTypeBytes), not UTF-8 or holding control
// characters; data that is not a JSON object or array or that PostgreSQL
// cannot store; an event over Config.MaxEventBytes; a misused reserved
// metadata key; a malformed or overflowing expected version. Most are an
// *InvalidEventError naming the event, field and limit. The SQL function
// checks the same rules for producers in other languages and reports them
// with the SQLSTATEs listed in errors.go and docs/sql-api.md (AN002 comes
// back to Go as an *InvalidEventError too).
package eventstore
