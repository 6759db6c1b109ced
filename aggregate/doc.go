// Package aggregate is the DDD repository of annals: it loads event-sourced
// aggregates from their streams (from a snapshot when there is one), runs
// commands on them and saves the events they record with optimistic
// concurrency.
//
// # Writing an aggregate
//
// An aggregate is a struct that embeds Base and has an Apply method that
// folds one event into its state. Commands are ordinary methods: they check
// the invariants against the current state and call Record for each
// decision, which applies the event and queues it for the next save.
//
//	type Account struct {
//		aggregate.Base
//		Balance int `json:"balance"`
//	}
//
//	func (a *Account) Apply(event any) error {
//		switch e := event.(type) {
//		case Opened:
//		case Deposited:
//			a.Balance += e.Amount
//		case Withdrawn:
//			a.Balance -= e.Amount
//		default:
//			return aggregate.ErrUnhandledEvent
//		}
//		return nil
//	}
//
//	func (a *Account) Withdraw(amount int) error {
//		if amount > a.Balance {
//			return ErrInsufficientFunds
//		}
//		return aggregate.Record(a, Withdrawn{Amount: amount})
//	}
//
// Events are registered in the store's eventstore.Registry (Register[T]);
// Apply receives them as values of the registered Go types.
//
// # Using the repository
//
//	accounts, err := aggregate.NewRepository(store, "account",
//		func() *Account { return &Account{} }, nil)
//	acc, err := accounts.Create(ctx, "42", func(a *Account) error { return a.Open("Ada") })
//	acc, err = accounts.Update(ctx, "42", func(a *Account) error { return a.Withdraw(30) })
//
// The aggregate "42" of type "account" lives in the stream "account-42"
// (Config.StreamID changes the naming). Load replays the stream; Save
// appends the recorded events expecting the stream to be at the version the
// aggregate was loaded at, so a concurrent writer makes it fail with
// eventstore.ErrWrongExpectedVersion rather than lose an update. Update
// wraps load, command and save in a loop that retries such conflicts a
// bounded number of times with a jittered backoff (Config.UpdateRetries,
// Config.UpdateBackoff) and then fails with ErrConflict. Create saves a new
// aggregate and fails with ErrAlreadyExists if the stream exists.
// CreateOrUpdate is Update for an aggregate that any command may start: the
// command runs on a new aggregate when the stream has no events, and a
// concurrent first command that created it meanwhile is retried as any
// conflict (it runs again on the winner's events).
//
// A Save whose outcome is unknown (its context ended or its connection was
// lost while the append was on its way: eventstore.ErrOutcomeUnknown) may
// have written the events. Save the same aggregate again, unchanged: its
// events keep the IDs the first attempt gave them, so the second Save is an
// idempotent re-append if the first was written (it returns nil, at the
// stored version, writing nothing twice) and an ordinary append, checking
// the expected version, if it was not.
//
// Errors: ErrNotFound for a missing aggregate, ErrInvalidID for an empty ID
// or one whose stream ID no append takes (over eventstore.MaxStreamIDBytes
// with its prefix, control characters, invalid UTF-8), and an error naming
// the event type, the Go type, the stream and the version for an event the
// aggregate does not handle (ErrUnhandledEvent) or the registry does not
// know (eventstore.ErrUnknownEventType).
//
// # In a transaction
//
// LoadTx, SaveTx, CreateTx and UpdateTx are the transactional twins: they
// read and append inside the caller's pgx.Tx, so the events commit with the
// caller's other writes (a saga's state, a read model) or not at all. SaveTx
// appends with eventstore.Store.AppendTx, which takes the log's ordering
// lock until the transaction ends: make it the last statement. UpdateTx
// does not retry a conflict (the transaction has failed); the caller
// retries the whole transaction. SaveTx writes no snapshot. Package saga's
// Update and Create use them; WithCause gives the events a causation and
// correlation ID from the context.
//
// # Snapshots
//
// With Config.Snapshots, a Save that brings the stream to or past a multiple
// of Every events also writes the aggregate's state (encoding/json of the
// aggregate, or its Snapshotter methods) to the snapshots table, in a
// transaction of its own after the append has committed: it never holds the
// log's ordering lock, and a failed write is logged, never returned. Load
// reads the snapshot written with the configured SchemaVersion and replays
// only the events after it; a snapshot of another schema version, or one
// that no longer decodes, is ignored and the stream is replayed from its
// first event. Snapshots are a cache: the table may be truncated at any
// time, and a load returns the same state with or without them. Its key is
// (aggregate type, stream, schema version), one row per key, replaced only
// by a newer one, so that during a rolling deploy the old and the new code
// each keep using their own snapshots. Config.OnLoad reports what a load
// read (LoadStats).
//
// Retention. The state of an aggregate is the fold of the events stream
// reads return. A snapshot records the first version its state folds (the
// stream's first visible one when the aggregate was loaded), and a load
// uses it only when that is still the stream's first visible version: after
// a truncation (or a delete and recreation) the snapshots from before are
// ignored, and those written since are used. On a stream with a maximum
// count they stop being used once its oldest events are hidden; a stream
// with a maximum age is always replayed (its visible events depend on the
// Store's clock). A Save writes no snapshot of a state that folds hidden
// events (an aggregate loaded before a truncation).
//
// Personal data. A state may hold personal fields (eventstore.PersonalData)
// decrypted before their subject was forgotten: an aggregate loaded before
// Store.Forget and saved after it, or loaded by a process whose key cache
// still held the key. So that no plaintext survives Forget in the
// snapshots, a snapshot is written only if no event its state folds carries
// personal data of a subject whose key is gone (the database checks the
// events' envelopes: which subjects a state holds only the log knows). A
// stream with personal data of a forgotten subject therefore gets no
// snapshots while those events are visible (the repository cannot tell a
// redacted state from one decrypted earlier); its loads replay it. The
// check and Forget serialise on an advisory lock that snapshot writes take
// shared and forget_subject exclusively: a write that has the lock commits
// before Forget deletes the stream's snapshots (so its row is deleted too),
// and a write after Forget sees the key gone. While a Forget runs, snapshot
// writes are skipped rather than wait.
//
// # Why an Apply method and an embedded Base
//
// Go event-sourcing libraries take one of two shapes. Most of them
// (looplab/eventhorizon's AggregateBase, hallgren/eventsourcing's
// AggregateRoot, Watermill's and Marten's examples) use an object with an
// Apply (or Transition) method and an embedded base that tracks the ID,
// the version and the uncommitted events. The decider pattern (Chassaing;
// Emmett and Equinox in other languages) uses two pure functions,
// decide(command, state) → events and evolve(state, event) → state, and
// keeps the bookkeeping outside the state.
//
// annals uses the first shape. Commands stay methods on the aggregate
// (acc.Withdraw(30)), which is what a Go reader of a DDD codebase expects
// and what IDEs navigate; invariants are checked against fields, not by
// threading a state value through functions; and one type parameter
// (Repository[*Account]) removes every cast. What it costs: Apply takes an
// `any` and dispatches with a type switch, so an unhandled event is found
// at run time (Apply returns ErrUnhandledEvent and the repository names the
// type) rather than at compile time; and the aggregate is a mutable value
// that must not be shared between goroutines. A decider is easy to express
// on top (Apply calls evolve; a command method calls decide and Record for
// each event), while the reverse would force every user to write commands
// as free functions. Unhandled events are errors rather than silently
// skipped: an aggregate that ignores an event it should apply would make
// decisions on wrong state.
package aggregate
