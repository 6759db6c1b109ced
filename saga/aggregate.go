package saga

import (
	"context"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/eventstore"
)

// Update runs command on the aggregate id of repo inside the instance's
// transaction (aggregate.Repository.UpdateTx): the aggregate is loaded in
// it, the command checks its business rules against that state, and the
// events it records are appended in it with the loaded version as the
// expected version, so they commit with the instance's state and the
// checkpoint, exactly once, or not at all. Each event's metadata gets the
// causation and correlation IDs of Append.
//
// A command's own error (a rule that refuses) is returned as is and
// nothing is saved; the transaction stays usable, so Handle may act on the
// refusal. Any other error, such as eventstore.ErrWrongExpectedVersion when
// another writer saved the aggregate meanwhile, must be returned from
// Handle: the runner rolls the event back and retries it by its
// RetryPolicy. Timers work the same way: a deadline event that reaches the
// saga is handled like any other, so its handler may call Update.
func Update[S any, A aggregate.Root](ctx context.Context, inst *Instance[S], repo *aggregate.Repository[A], id string, command func(A) error) (A, error) {
	var zero A
	if err := inst.live(); err != nil {
		return zero, err
	}
	if repo == nil || command == nil {
		return zero, errors.New("Update needs a repository and a command")
	}
	inst.rt.appended(inst.event.ID) // the save takes the ordering lock: commit right after this event
	a, err := repo.UpdateTx(aggregate.WithCause(ctx, inst.cause()), inst.tx, id, command)
	return a, commandError(err, repo.Type(), id)
}

// Create runs command on a new aggregate id of repo and saves it inside the
// instance's transaction (aggregate.Repository.CreateTx), as Update does;
// it fails with aggregate.ErrAlreadyExists if the aggregate exists.
func Create[S any, A aggregate.Root](ctx context.Context, inst *Instance[S], repo *aggregate.Repository[A], id string, command func(A) error) (A, error) {
	var zero A
	if err := inst.live(); err != nil {
		return zero, err
	}
	if repo == nil || command == nil {
		return zero, errors.New("Create needs a repository and a command")
	}
	inst.rt.appended(inst.event.ID)
	a, err := repo.CreateTx(aggregate.WithCause(ctx, inst.cause()), inst.tx, id, command)
	return a, commandError(err, repo.Type(), id)
}

// commandError names the aggregate in err, keeping what it matches (the
// command's own error included). The saga and instance are named once, by
// the runtime, when Handle returns the error.
func commandError(err error, typ, id string) error {
	if err == nil {
		return nil
	}
	return errors.Wrapf(err, "command on %s %q", typ, id)
}

// cause is the metadata whose causation and correlation IDs the instance's
// effects carry (see Append).
func (i *Instance[S]) cause() eventstore.Metadata {
	corr := i.event.Metadata.CorrelationID
	if corr == "" {
		corr = i.event.ID.String()
	}
	return eventstore.Metadata{CausationID: i.event.ID.String(), CorrelationID: corr}
}
