package projection

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/recovered"
)

// Projection builds a read model in the same database as the log. Each batch
// of events runs in one transaction on the connection that holds the
// subscriber's lock, together with the checkpoint update: the read-model
// writes of an event are committed exactly once, or not at all.
type Projection interface {
	// Name identifies the subscriber: its checkpoint and its lock.
	Name() string
	// Handle applies one event inside tx. An error rolls back the batch's
	// work from this event on; the event is retried.
	Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error
}

// Observer performs side effects outside the database (send an e-mail, call
// an API, publish a message). Delivery is at-least-once: after a crash,
// events since the last flushed checkpoint are delivered again, so Handle
// should be idempotent, keyed by e.ID.
type Observer interface {
	// Name identifies the subscriber: its checkpoint and its lock.
	Name() string
	// Handle processes one event. An error retries it.
	Handle(ctx context.Context, e eventstore.Event) error
}

// CommitCutter is implemented by projections whose Handle may take the
// log's ordering lock: by appending events in the batch's transaction, as
// package saga's effects do. That lock is held until the transaction ends,
// and every append in the database waits for it meanwhile; so after each
// event for which CommitAfter reports true, the runner commits the batch's
// transaction at once, with the checkpoint at that event, and handles the
// rest of the batch in a new transaction. Events that take no lock still
// share transactions.
type CommitCutter interface {
	// CommitAfter reports whether the transaction should commit right after
	// e was handled (successfully) in it. It is called right after that
	// Handle call, on the goroutine of e's partition; a projection with
	// several partitions is called from several goroutines.
	CommitAfter(e eventstore.Event) bool
}

// Resetter is implemented by projections that can clear their read model,
// for rebuilds: Reset runs in the transaction that sets the checkpoint back.
type Resetter interface {
	Reset(ctx context.Context, tx pgx.Tx) error
}

// TypeLister is implemented by handlers that know which event types they
// handle (the typed projections and observers of this package); the runner
// then reads only those types unless Options.Types says otherwise.
type TypeLister interface {
	EventTypes() []string
}

// safely calls fn, turning a panic into an error with its stack.
func safely(fn func() error) error { return recovered.Call("handler", fn) }
