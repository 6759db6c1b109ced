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
// Appends go through SQL functions (append_events_json for an append in a
// transaction, append_batch and append_one for group commit: see below),
// each of which takes a transaction-scoped advisory lock before it numbers
// its events and holds it until commit. PostgreSQL makes a committing
// transaction visible before it releases its locks, so the next append can
// only number its events after the previous one is visible. Only the
// numbering is serialized: the rest of a transaction runs concurrently. To
// keep the lock short, an append should be the last statement of its
// transaction. Append (its own transaction) and Transact (the caller's work
// first, then the appends and COMMIT in one round trip) arrange that;
// AppendTx leaves it to the caller.
//
// Every path stores each event's data and metadata as sent, byte for byte
// (the columns are json), so what Config.MaxEventBytes measured is what is
// stored, and the same event is stored alike whichever path it took. Before
// migration 0035 appends in a transaction went through append_events, whose
// jsonb argument stored jsonb's rendering (keys sorted, a duplicate key's
// last value kept, 1e2 as 100, 1e131000 as its 131,001 digits). A Store
// still calls append_events when the role that appends may not execute
// append_events_json (a schema migrated before 0035, a role granted by an
// older annals grant), and chooses by the role of each transaction, not
// once for all: the server reports each session's user, and the Store
// asks once per session user about every role that user may take with
// SET ROLE. When they all agree (the common case: one role, or roles all
// granted by the same annals), the choice costs a look-up and no round
// trip (about 25 ns, BenchmarkAppendQuery); a user who may take roles of
// both kinds has the role in effect asked in each transaction, a round
// trip, until annals grant evens them out (an answer other than
// append_events_json is asked again after a minute). A lone append (no
// group commit) of such a user asks and appends in one transaction,
// pipelined in the two round trips of two statements, so that a pooler in
// transaction mode runs both on one server session. A superuser in effect
// (is_superuser, which the server also reports, and SET ROLE changes) may
// execute any function: its appends cost the look-up whatever the other
// roles of the cluster were granted, and only the roles it takes by SET
// ROLE are asked about. A proxy that reports no session user has the
// answer kept per connection (asked once by each). Privileges that
// change after the Store asked show as ErrNotGranted (SQLSTATE 42501) on
// the one append that meets them, after which the Store asks again.
//
// # Group commit
//
// Because the lock is held through COMMIT and its WAL flush, appends that
// each commit on their own run one at a time, at the rate of the disk's
// flushes (a few thousand per second), however many writers there are.
// Store.Append therefore coalesces the concurrent appends of a process:
//
//   - Append validates and encodes its events, then queues itself.
//   - If no group is on its way (or a second may go: GroupCommit.MaxInFlight,
//     default 2, for when at least ParallelEvents, default 200, events are
//     queued), the appending goroutine takes a group at once: the oldest
//     queued appends, at most one per stream (a later append to the same
//     stream waits for the next group, so per-stream order is queue
//     order) and no two sharing a caller-chosen event ID, up to
//     GroupCommit.MaxEvents (400) events. A group of its own append alone
//     it sends itself, so a lone writer sends its append without waiting
//     for anybody or handing it to another goroutine; a group holding
//     others' appends goes from a new goroutine, and the taker waits for
//     its own outcome as every member does (so it can leave when its
//     context ends, while the group goes on for the others).
//   - A group is one call of the SQL function append_batch, one statement
//     and so one transaction: one round trip, one acquisition of the
//     ordering lock, one WAL flush for all its appends. append_batch decides
//     every append on its own (written; wrong expected version, with the
//     actual version; event IDs stored with other content; an idempotent
//     re-append answered with the stored positions), so one append's
//     failure never fails its group-mates. Positions are drawn for the whole
//     group in argument order; a failed append leaves unused positions, as a
//     rolled-back one does. The call's arrays are written in PostgreSQL's
//     binary format by this package (batchwire.go), in one buffer sized up
//     front, and its rows read from the received bytes: pgx's own encoding
//     boxes every element and regrows its buffer from 256 bytes on every
//     call, a fifth of the client's CPU in groups of 400 events. The call
//     goes around pgx's Query (straight to the connection's PgConn), so a
//     pgx QueryTracer on the pool does not see it; each append's own span
//     and metrics do.
//   - A group of one append of one event, what a lone writer (a service
//     handling one request at a time) sends, calls append_one instead: the
//     same rules and outcomes, taken as scalars, with one UPDATE of the
//     stream's row for its version in the common case and one result row
//     (a lone append's server CPU 241-245 -> 177-185 µs; docs/benchmarks.md).
//     The input rules of both functions live in two SQL functions that
//     PostgreSQL inlines into them (stream_input_bad, event_input_bad).
//   - When a group finishes, its sender hands every member its outcome and,
//     if appends are queued or the group had several members, keeps the
//     slot for up to GroupCommit.Linger (200µs) until the members just
//     answered have queued again, then sends the next group from a new
//     goroutine: writers in a loop travel together, so groups grow with the
//     load. (Without the linger, 16 looping writers split into cohorts that
//     take turns: groups of 8 and 8, or 1 and 16. More groups in flight
//     would let one wait for the lock while another commits, but would also
//     split the waiting appends and pay one WAL flush per group under the
//     lock: so a second group goes only for large appends, whose encoding
//     and checks then overlap the commit ahead.) A lone appender never
//     waits. Appenders that are paced rather than looping (requests that
//     arrive on their own) do not come back within the linger: when
//     nobody joins two lingers in a row of groups of small appends (fewer
//     than ParallelEvents events), the next 8 such groups leave at once,
//     and the one after them lingers again, so such appends do not each
//     pay it (one linger missed alone may be a pause of looping writers).
//   - A group that fails as a whole (an error no single outcome explains,
//     such as a lost connection) is re-sent append by append through
//     append_events_json, so each member learns its own outcome; re-sending
//     an append that did commit is harmless, as it is an idempotent
//     re-append.
//     A lone append is re-sent so only after a unique violation (23505):
//     the retry of an append whose caller-chosen IDs its original stored
//     while the retry waited for the ordering lock. append_one and
//     append_batch look IDs up before the lock (again under it only when a
//     stream refuses the append: migration 0025), as a look-up under it
//     would cost every append; append_events_json looks them up under it and
//     answers the stored positions. A lone append whose statement was sent
//     and got no answer (a lost connection, a terminated session) is
//     outcome-unknown (below).
//   - A caller whose context ends while its append is still queued gets the
//     context's error marked ErrNotWritten, and nothing is written; once
//     its group is on its way, the outcome is decided by the group, and the
//     caller gets an *OutcomeUnknownError (ErrOutcomeUnknown, and the
//     context's error) at once. A group's statement is cancelled only when
//     every member's context has ended.
//
// Positions remain commit order, known when Append returns, and the
// transactions of AppendTx and Transact are untouched (they commit on their
// own, as the caller's transaction must). docs/architecture.md says why group
// commit was chosen over a sequencer that numbers events after commit.
//
// # Inline projections
//
// Config.Inline lists projections (package projection's Projection, or any
// InlineProjection) applied in the transaction of every append through the
// Store: the read model commits with the events or not at all, so a writer
// reads its own write at once. Because the log's ordering lock is held
// from the append to COMMIT, the handlers run before the append, never
// under the lock:
//
//  1. Append opens a transaction of its own, so inline appends do not join
//     group commit (an append whose events no inline projection handles
//     keeps the group-commit path); AppendTx and Transact use the caller's.
//  2. If some event IDs came from the caller, they are looked up: stored
//     ones make the append an idempotent re-append or an ID conflict, sent
//     as is, with no handler run.
//  3. The stream's version is read (no lock: nothing here may make an
//     append wait) and becomes the append's exact expected version: with
//     Any or StreamExists too. The events get the versions they will be
//     stored at.
//  4. Each inline projection handles each event in the transaction.
//     GlobalSequence is 0 and RecordedAt zero: both are assigned under the
//     lock. An error (or panic) fails the append with an *InlineError
//     (ErrInlineProjection), and nothing is stored.
//  5. The append and the COMMIT go in one round trip, as for any Transact;
//     with caller-chosen IDs a check rides along that this transaction
//     wrote the events (an index probe, no round trip), in case another
//     writer stored them after step 2: ErrStoredConcurrently then.
//
// A writer that appended to the stream after step 3 makes the append fail
// with ErrWrongExpectedVersion, and the handlers' writes roll back with
// it: a read model row is never written for a version that is not stored.
// Append retries that conflict itself when the caller's expected version
// was Any or StreamExists (up to 10 times, re-running the handlers, after
// a random pause that doubles from under 1 ms to at most 64 ms; a retry,
// and the first attempt of an Append to a stream that conflicted in the
// last second, queue first on a transaction-level advisory lock of the
// stream, so the Appends to a hot stream take turns instead of racing, and
// none runs out of retries against another);
// AppendTx and Transact return it (the whole transaction is the caller's
// to retry). The lock is held for no longer than without inline
// projections (projection/TestInlineHoldsTheAppendLockNoLonger): no round
// trip under it either way.
//
// Inline projections see only appends through a Store configured with
// them; an append from elsewhere (another service, SQL) passes them by. A
// projection that must see every event runs in the projection runner
// (asynchronously); the same projection can be rebuilt there
// (projection.Runner.Rebuild) into the read model its inline use built.
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
// nothing, so a client may retry an append whose outcome it did not learn,
// even while the first attempt is still committing.
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
// # Deleting streams and retention
//
// DeleteStream appends one event of the reserved type StreamDeletedType
// ("$stream.deleted") to a stream and marks it deleted; with
// DeleteOptions.Hard it becomes a tombstone. Reads of a deleted stream fail
// with ErrStreamDeleted (a *StreamDeletedError carrying the version);
// an append that expects exactly that version recreates it (its versions
// continue and reads start after the deletion), every other append fails
// with ErrStreamDeleted, and every append to a tombstone with
// ErrStreamTombstoned. The state is checked in the look-up of the stream
// row each append already makes (append_events_json, append_batch: in a group
// commit, a deleted stream is one append's outcome, not the group's).
//
// SetStreamRetention sets a stream's maximum age and count and raises its
// truncate-before version; stream reads honour them at once (by
// Config.Clock), and a "$stream.truncated" event (StreamTruncatedType) in
// MetadataStream(stream) records each change. A truncate-before below the
// stream's is refused (an *InvalidEventError for "truncate_before"), and a
// call that changes nothing records nothing (RetentionResult.Unchanged;
// migration 0040). Until the scavenger (package
// scavenge) removes them, hidden and deleted events stay in the log and
// ReadAll and subscriptions see them. Types starting with
// ReservedTypePrefix cannot be appended; RegisterLifecycleEvents registers
// their Go types for decoding.
//
// # Personal data and forgetting (crypto-shredding)
//
// Register a type with PersonalData(subject field) and tag its personal
// top-level fields `annals:"personal"`; give the Store a KEK
// (Config.KEK: NewLocalKEK, or a KMS implementing KeyEncrypter). Before an
// append, each personal field's JSON is encrypted with AES-256-GCM under the
// subject's data key (a random nonce per field, or for a caller-chosen
// event ID one derived from the data key, the ID, the field and its value,
// so that a retried append is recognised as stored; subject and field name
// as additional data) and replaced by {"$personal": {"v": 1, "subject",
// "kind", "data"}}. A subject's data key is 32 random bytes made at its
// first append, stored in the personal_keys table wrapped by the KEK (an
// INSERT ... ON CONFLICT DO NOTHING then a read, so concurrent first appends
// agree on one key). Unwrapped keys are cached in an LRU of
// Config.KeyCacheSize subjects, each trusted for Config.KeyCacheTTL.
//
// Decryption is type-agnostic: Registry.Upcast (which every read path
// calls: ReadAll, ReadStream, Decode, Decode[T], the projection runner with
// a Registry) first replaces each envelope in the event's top-level object
// by its plaintext, using the key ring the Store attached to its registry.
// Store.Forget destroys the subject's key (forget_subject: the row keeps a
// tombstone, forgotten_at) and deletes the snapshots of the streams holding
// its personal data; from then on its fields decode to Forgotten
// ("[forgotten]") when they were strings and to null (the zero value)
// otherwise, and new personal data of the subject is refused
// (ErrSubjectForgotten). Without a KEK, reads redact forgotten subjects and
// leave the others' envelopes as they are. See docs/operations.md,
// "Forgetting people", and docs/guarantees.md §16.
//
// # Errors
//
// Bad input fails with ErrInvalidEvent before anything is sent: a stream ID
// or type that is empty, only whitespace, over its byte limit
// (MaxStreamIDBytes, MaxEventTypeBytes), not UTF-8 or holding control
// characters; data that is not a JSON object or array or that PostgreSQL
// cannot store; an event over Config.MaxEventBytes; a misused reserved
// metadata key; a malformed or overflowing expected version. Most are an
// *InvalidEventError naming the event, field and limit.
//
// A NUL character (the escape \u0000, in a value or a key of data or
// metadata, or "\x00" in a Go string that becomes one) is refused on every
// path (encoded appends and DeleteStream's metadata included), although the
// json columns could hold the escape: whoever reads such a value as text
// or jsonb fails on it (SQLSTATE 22P05), at every read, for good: a
// projection's ->> or ::jsonb, forget_subject and scavenge (which read
// personal data as jsonb), a re-append's comparison, a read model's text
// column, and readers in other languages whose strings cannot hold NUL.
// Refused at the append, the writer learns it at once. append_events cannot
// take such text at all (jsonb refuses it before the function runs), so
// accepting it elsewhere would make an event storable by some paths only.
// The server refuses it too (append_one and append_batch with AN002,
// append_events_json and append_events with 22P05, which the Go client
// turns into the same *InvalidEventError). The SQL function
// checks the same rules for producers in other languages and reports them
// with the SQLSTATEs listed in errors.go and docs/sql-api.md (AN002 comes
// back to Go as an *InvalidEventError too).
//
// Every error of Store.Append means nothing was written, except one that
// matches ErrOutcomeUnknown: the append was sent, and its caller's context
// ended or its connection failed before the answer came. It may have been
// written. The error is an *OutcomeUnknownError holding the event IDs the
// append was sent with (those annals generated too): append the same
// events again with those IDs (EventData.ID) and the same expected
// version, and the answer is the outcome, since re-appending stored events
// is idempotent. An error that matches ErrNotWritten says the append was
// never sent (its context ended first): it may simply be made again. Both
// also match the context's error when a context ended, and both match
// under the standard library's errors.Is as under cockroachdb's. (Through
// inline projections a context error that ended the append before its
// append and COMMIT were sent is neither; nothing was written.)
package eventstore
