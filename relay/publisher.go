package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/catchup"
)

// publisher is the relay's catchup.Processor: it publishes each batch,
// pipelined, waits for every acknowledgement, and only then commits the
// checkpoint (fenced by the lease's epoch).
type publisher struct {
	r      *Relay
	stream jetstream.Stream

	// What the stream is known to hold last: its position and message ID.
	// synced is false until read from the stream (at the start of each
	// leadership and after any failed publish).
	synced  bool
	lastPos int64
	lastID  string
}

func (p *publisher) Start(ctx context.Context, lease *catchup.Lease) error {
	p.synced = false
	return nil
}

func (p *publisher) sync(ctx context.Context) error {
	pos, id, err := p.r.lastStored(ctx, p.stream)
	if err != nil {
		return err
	}
	p.lastPos, p.lastID, p.synced = pos, id, true
	return nil
}

// Process publishes the batch's events and commits the checkpoint through
// the last event acknowledged in order (batch.Through when all were).
//
// Each message carries Nats-Msg-Id (the event ID) and
// Nats-Expected-Last-Msg-Id (the ID of the event before it, as the stream
// holds it): JetStream stores a message only right after its predecessor,
// so the stream always holds a prefix of the relay's sequence, in position
// order, whatever is lost or re-sent; a message already stored is dropped
// as a duplicate before that check. Events at or below the position of the
// stream's newest message are not published again at all.
func (p *publisher) Process(ctx context.Context, lease *catchup.Lease, batch catchup.Batch) (int64, error) {
	if !p.synced {
		if err := p.sync(ctx); err != nil {
			return batch.After, err
		}
	}
	type sent struct {
		pos int64
		id  string
		f   jetstream.PubAckFuture
	}
	inflight := make([]sent, 0, len(batch.Events))
	prev := p.lastID
	var pubErr error
	for _, e := range batch.Events {
		if e.GlobalSequence <= p.lastPos {
			continue // stored already (a takeover after an uncommitted checkpoint)
		}
		msg, err := Message(p.r.cfg.Name, p.r.subj.render(e), e)
		if err != nil {
			pubErr = err
			break
		}
		opts := []jetstream.PublishOpt{jetstream.WithMsgID(e.ID.String()), jetstream.WithExpectStream(p.r.cfg.Stream)}
		if prev != "" {
			opts = append(opts, jetstream.WithExpectLastMsgID(prev))
		}
		f, err := p.r.js.PublishMsgAsync(msg, opts...)
		if err != nil {
			pubErr = errors.Wrapf(err, "relay: publish event %d", e.GlobalSequence)
			break
		}
		inflight = append(inflight, sent{e.GlobalSequence, e.ID.String(), f})
		prev = e.ID.String()
	}
	// Wait for the acknowledgements in order; the checkpoint may pass only
	// an unbroken run of them.
	acked := batch.After
	timeout := time.NewTimer(p.r.cfg.AckTimeout)
	defer timeout.Stop()
	for _, s := range inflight {
		var err error
		select {
		case <-s.f.Ok():
		case err = <-s.f.Err():
		case <-timeout.C:
			err = errors.Newf("relay: no acknowledgement within %v", p.r.cfg.AckTimeout)
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err != nil {
			if pubErr == nil {
				pubErr = errors.Wrapf(err, "relay: publish event %d", s.pos)
			}
			break
		}
		acked = s.pos
		p.lastPos, p.lastID = s.pos, s.id
	}
	done := acked
	if pubErr == nil {
		done = batch.Through
	} else {
		p.synced = false
	}
	if done > batch.After {
		if err := lease.Lock.Do(ctx, func(conn *pgx.Conn) error { return lease.Commit(ctx, conn, done) }); err != nil {
			return batch.After, err
		}
		if p.r.cfg.OnCommitted != nil {
			p.r.cfg.OnCommitted(done)
		}
	}
	if pubErr != nil {
		p.r.cfg.Logger.WarnContext(ctx, "annals: relay publish failed; retrying from the last acknowledged event",
			slog.String("relay", p.r.cfg.Name), slog.Int64("acknowledged_through", done), slog.Any("error", pubErr))
	}
	return done, pubErr
}

func (p *publisher) Redeliver(ctx context.Context, lease *catchup.Lease) error { return nil }
func (p *publisher) Idle(ctx context.Context, lease *catchup.Lease) error      { return nil }
func (p *publisher) End(ctx context.Context, lease *catchup.Lease) error       { return nil }
