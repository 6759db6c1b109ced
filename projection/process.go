package projection

import (
	"context"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
)

// txProcessor runs a Projection: each batch in one transaction on the lock's
// connection, with the fenced checkpoint update.
type txProcessor struct {
	p Projection
}

func (t *txProcessor) Start(context.Context, *catchup.Lease) error { return nil }
func (t *txProcessor) Idle(context.Context, *catchup.Lease) error  { return nil }
func (t *txProcessor) End(context.Context, *catchup.Lease) error   { return nil }

func (t *txProcessor) Process(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (int64, error) {
	failedAt, err := t.apply(ctx, lease, b.Events, b.Through)
	if err == nil {
		return b.Through, nil
	}
	if failedAt <= 0 {
		return b.After, err
	}
	// The events before the failing one commit on their own, so the failing
	// event is retried alone and its batch-mates are applied exactly once.
	before := b.Events[:failedAt]
	if _, err2 := t.apply(ctx, lease, before, before[len(before)-1].GlobalSequence); err2 != nil {
		return b.After, errors.CombineErrors(err, err2)
	}
	return before[len(before)-1].GlobalSequence, err
}

// apply runs events in one transaction with the checkpoint at through. On a
// handler error it returns the index of the failing event.
func (t *txProcessor) apply(ctx context.Context, lease *catchup.Lease, events []eventstore.Event, through int64) (int, error) {
	failedAt := -1
	err := lease.Lock.Do(ctx, func(conn *pgx.Conn) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			for i, e := range events {
				if err := safely(func() error { return t.p.Handle(ctx, tx, e) }); err != nil {
					failedAt = i
					return errors.Wrapf(err, "projection %q: event %d (%s, stream %s v%d)", t.p.Name(), e.GlobalSequence, e.Type, e.StreamID, e.StreamVersion)
				}
			}
			return lease.Commit(ctx, tx, through)
		})
	})
	return failedAt, err
}

// observerProcessor runs an Observer outside any transaction, with batched
// checkpoints written through the lock's connection.
type observerProcessor struct {
	o        Observer
	every    int
	interval time.Duration
	batcher  *checkpoint.Batcher
}

func (p *observerProcessor) Start(ctx context.Context, lease *catchup.Lease) error {
	commit := func(ctx context.Context, pos int64) error {
		if lease.Ephemeral() {
			return nil
		}
		return lease.Lock.Do(ctx, func(conn *pgx.Conn) error { return lease.Commit(ctx, conn, pos) })
	}
	p.batcher = checkpoint.NewBatcher(commit, lease.Start, p.every, p.interval, nil)
	return nil
}

func (p *observerProcessor) Process(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (int64, error) {
	done := b.After
	for i, e := range b.Events {
		if err := safely(func() error { return p.o.Handle(ctx, e) }); err != nil {
			if ferr := p.batcher.Advance(ctx, done, i); ferr != nil {
				return done, errors.CombineErrors(err, ferr)
			}
			return done, errors.Wrapf(err, "observer %q: event %d (%s, stream %s v%d)", p.o.Name(), e.GlobalSequence, e.Type, e.StreamID, e.StreamVersion)
		}
		done = e.GlobalSequence
	}
	if err := p.batcher.Advance(ctx, b.Through, len(b.Events)); err != nil {
		// The events are handled; only the checkpoint write failed. Fencing
		// ends the leadership; anything else is retried at the next flush.
		return b.Through, err
	}
	return b.Through, nil
}

// Idle writes the checkpoint when CheckpointInterval has passed since the
// last write: an idle observer does not write once per event at low rates.
func (p *observerProcessor) Idle(ctx context.Context, _ *catchup.Lease) error {
	if p.batcher == nil {
		return nil
	}
	return p.batcher.FlushIfDue(ctx)
}

// End writes the checkpoint: a graceful shutdown re-delivers nothing.
func (p *observerProcessor) End(ctx context.Context, _ *catchup.Lease) error {
	if p.batcher == nil {
		return nil
	}
	return p.batcher.Flush(ctx)
}
