package natsconsumer

import (
	"context"
	_ "embed"
	"io"
	"log/slog"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
	"github.com/annals-dev/annals/relay"
)

//go:embed queries.sql
var queriesSQL string

// Config configures a Consumer. Durable is required.
type Config struct {
	// Stream is the relay's JetStream stream. Defaults to "ANNALS".
	Stream string
	// Durable is the durable consumer's name: it keeps its place on the
	// server, and (RunProjection) names its checkpoint row. Required.
	Durable string
	// Types are event-type glob patterns (catchup.ParseFilter): other events
	// are acknowledged and skipped (they still move the checkpoint).
	// Defaults to all types.
	Types []string
	// Registry upcasts each event (eventstore.Registry.Upcast) before the
	// handler sees it. Defaults to nil: events as relayed.
	Registry *eventstore.Registry
	// Batch is how many messages are fetched at a time. Defaults to 100.
	Batch int
	// AckWait is how long the server waits for an acknowledgement before it
	// delivers a message again. Defaults to 30s.
	AckWait time.Duration
	// RetryBackoff is the pause after a failed handler before the event is
	// tried again. Defaults to 500ms.
	RetryBackoff time.Duration
	// Schema is the schema of the checkpoint table RunProjection keeps in the
	// service's database ("<schema>.relay_checkpoints", created if
	// missing). Defaults to "annals".
	Schema string
	// Logger receives handler failures. Defaults to discarding.
	Logger *slog.Logger
}

// Consumer reads relayed events from a durable JetStream consumer.
type Consumer struct {
	cfg    Config
	js     jetstream.JetStream
	stream jetstream.Stream
	cons   jetstream.Consumer
	filter catchup.Filter
}

// New creates (or updates) the durable consumer on the relay's stream and
// returns a Consumer reading it. The consumer takes the whole stream, in
// order, acknowledging explicitly; Types are filtered here, not on the
// server, so the stream's sequence stays gap-free for the order check.
func New(ctx context.Context, nc *nats.Conn, cfg *Config) (*Consumer, error) {
	if nc == nil || cfg == nil || cfg.Durable == "" {
		return nil, errors.New("natsconsumer: a NATS connection and Config.Durable are required")
	}
	c := *cfg
	if c.Stream == "" {
		c.Stream = "ANNALS"
	}
	if c.Batch <= 0 {
		c.Batch = 100
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = 500 * time.Millisecond
	}
	if c.Schema == "" {
		c.Schema = "annals"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	filter, err := catchup.ParseFilter(c.Types)
	if err != nil {
		return nil, errors.Wrap(err, "natsconsumer")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, errors.Wrap(err, "natsconsumer: JetStream")
	}
	stream, err := js.Stream(ctx, c.Stream)
	if err != nil {
		return nil, errors.Wrapf(err, "natsconsumer: stream %s", c.Stream)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: c.Durable, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait: c.AckWait, MaxAckPending: c.Batch,
	})
	if err != nil {
		return nil, errors.Wrapf(err, "natsconsumer: consumer %s", c.Durable)
	}
	return &Consumer{cfg: c, js: js, stream: stream, cons: cons, filter: filter}, nil
}

// delivery is one fetched message and its event.
type delivery struct {
	msg   jetstream.Msg
	seq   uint64
	event eventstore.Event
}

// fetch returns the next messages (up to Batch, waiting up to a second).
func (c *Consumer) fetch(ctx context.Context) ([]delivery, error) {
	batch, err := c.cons.Fetch(c.cfg.Batch, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		return nil, errors.Wrap(err, "natsconsumer: fetch")
	}
	var out []delivery
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			return out, errors.Wrap(err, "natsconsumer: message metadata")
		}
		e, err := relay.Decode(m.Headers(), m.Data())
		if err != nil {
			return out, errors.Wrapf(err, "natsconsumer: stream message %d", md.Sequence.Stream)
		}
		if c.cfg.Registry != nil {
			if e, err = c.cfg.Registry.Upcast(e); err != nil {
				return out, errors.Wrapf(err, "natsconsumer: upcast event %d", e.GlobalSequence)
			}
		}
		out = append(out, delivery{msg: m, seq: md.Sequence.Stream, event: e})
	}
	return out, errors.Wrap(batch.Error(), "natsconsumer: fetch")
}

// Run calls handle for each relayed event whose type matches, in stream
// order, and acknowledges it once handle returned nil: at-least-once (a
// crash between the two delivers the event again; handle gets e.ID for
// idempotency). A failed handle is retried after RetryBackoff, and the
// events after it wait. It returns nil when ctx ends.
func (c *Consumer) Run(ctx context.Context, handle func(ctx context.Context, e eventstore.Event) error) error {
	// In order from the consumer's acknowledgement floor: every message up
	// to it was handled (they are acknowledged in order).
	info, err := c.cons.Info(ctx)
	if err != nil {
		return errors.Wrapf(err, "natsconsumer: consumer %s", c.cfg.Durable)
	}
	done := info.AckFloor.Stream
	return c.run(ctx, func(ctx context.Context, d delivery) error {
		if c.filter.Match(d.event.Type) {
			if err := handle(ctx, d.event); err != nil {
				return err
			}
		}
		return d.ack()
	}, &done)
}

// RunProjection runs p (the same Projection a runner in the source database
// runs) over the relayed events in this service's database: each event is
// handled in a transaction on pool that also moves the consumer's
// checkpoint (the stream sequence, in "<schema>.relay_checkpoints"), so its
// effects are applied exactly once; the message is acknowledged after the
// commit, and a message at or below the checkpoint (a re-delivery) is
// acknowledged without being handled. One RunProjection per Durable at a
// time (run it leader-elected, e.g. as a projection.Service, when several
// instances run).
func (c *Consumer) RunProjection(ctx context.Context, pool *pgxpool.Pool, p interface {
	Name() string
	Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error
}) error {
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(c.cfg.Schema))
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, q["CreateSchema"]); err != nil {
		return errors.Wrap(err, "natsconsumer: create the checkpoint schema")
	}
	if _, err := pool.Exec(ctx, q["CreateTable"]); err != nil {
		return errors.Wrap(err, "natsconsumer: create the checkpoint table")
	}
	var checkpoint uint64
	if err := pool.QueryRow(ctx, q["Load"], c.cfg.Durable).Scan(&checkpoint); err != nil {
		return errors.Wrap(err, "natsconsumer: load the checkpoint")
	}
	return c.run(ctx, func(ctx context.Context, d delivery) error {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if c.filter.Match(d.event.Type) {
				if err := p.Handle(ctx, tx, d.event); err != nil {
					return err
				}
			}
			tag, err := tx.Exec(ctx, q["Save"], c.cfg.Durable, int64(d.seq))
			if err == nil && tag.RowsAffected() != 1 {
				err = errors.Newf("natsconsumer: checkpoint of %s moved under us", c.cfg.Durable)
			}
			return err
		})
		if err != nil {
			return err
		}
		checkpoint = d.seq
		return d.ack()
	}, &checkpoint)
}

// ack acknowledges the delivery's message; one read from the stream by
// sequence (see fill) has none.
func (d delivery) ack() error {
	if d.msg == nil {
		return nil
	}
	return d.msg.Ack()
}

// run fetches and handles in stream order, from the sequence after *done
// (RunProjection: its checkpoint; Run: the consumer's acknowledgement
// floor), which handle moves (RunProjection) or run does (Run) as each
// message is handled. A message at or below *done was handled already (a
// re-delivery) and is acknowledged. A message further than one past *done
// means that the ones before it are still unacknowledged somewhere: a
// process that fetched them crashed, and the server will send them again
// only after AckWait, behind whatever it delivers meanwhile (and behind it
// again after each Nak). Rather than wait for that order, fill reads the
// missing messages from the stream by sequence and handles them first;
// their re-deliveries come later, at or below *done. A failed delivery is
// retried in place after RetryBackoff; the rest of the fetched batch waits
// (it is handled after it, not re-fetched).
func (c *Consumer) run(ctx context.Context, handle func(context.Context, delivery) error, done *uint64) error {
	for ctx.Err() == nil {
		ds, err := c.fetch(ctx)
		if err != nil && ctx.Err() == nil && !errors.Is(err, nats.ErrTimeout) {
			c.cfg.Logger.WarnContext(ctx, "annals: fetching relayed events failed", telemetry.Err(err))
			_ = sleep(ctx, c.cfg.RetryBackoff)
		}
	batch:
		for i := 0; i < len(ds); i++ {
			d := ds[i]
			handBack := func() {
				for _, rest := range ds[i:] {
					_ = rest.msg.Nak()
				}
			}
			if ctx.Err() != nil {
				// Stopping: hand the rest back at once rather than after AckWait.
				handBack()
				return nil
			}
			if d.seq <= *done {
				_ = d.msg.Ack()
				continue
			}
			if d.seq > *done+1 {
				if err := c.fill(ctx, d.seq, handle, done); err != nil {
					handBack()
					if ctx.Err() != nil {
						return nil
					}
					c.cfg.Logger.WarnContext(ctx, "annals: reading relayed events missing before a delivery failed; retrying",
						slog.String("consumer", c.cfg.Durable), slog.Uint64("after", *done), telemetry.Err(err))
					_ = sleep(ctx, c.cfg.RetryBackoff)
					break batch
				}
			}
			if !c.handle(ctx, d, handle) {
				handBack()
				return nil
			}
			*done = d.seq
		}
	}
	return nil
}

// fill handles, in order, the messages the stream holds between *done and
// upto (exclusive), read by sequence. Those it no longer holds (aged out by
// MaxAge, deleted) are passed over.
func (c *Consumer) fill(ctx context.Context, upto uint64, handle func(context.Context, delivery) error, done *uint64) error {
	info, err := c.stream.Info(ctx)
	if err != nil {
		return errors.Wrapf(err, "natsconsumer: stream %s", c.cfg.Stream)
	}
	for seq := max(*done+1, info.State.FirstSeq); seq < upto; seq++ {
		m, err := c.stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return errors.Wrapf(err, "natsconsumer: read stream message %d", seq)
		}
		e, err := relay.Decode(m.Header, m.Data)
		if err != nil {
			return errors.Wrapf(err, "natsconsumer: stream message %d", seq)
		}
		if c.cfg.Registry != nil {
			if e, err = c.cfg.Registry.Upcast(e); err != nil {
				return errors.Wrapf(err, "natsconsumer: upcast event %d", e.GlobalSequence)
			}
		}
		if !c.handle(ctx, delivery{seq: seq, event: e}, handle) {
			return ctx.Err()
		}
		*done = seq
	}
	*done = max(*done, upto-1)
	return nil
}

// handle runs handle for d until it succeeds, pausing RetryBackoff after
// each failure (the events after it wait). It reports false when ctx ended
// first.
func (c *Consumer) handle(ctx context.Context, d delivery, handle func(context.Context, delivery) error) bool {
	for {
		err := handle(ctx, d)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		c.cfg.Logger.WarnContext(ctx, "annals: handling a relayed event failed; retrying",
			slog.String("consumer", c.cfg.Durable), slog.Int64("position", d.event.GlobalSequence), telemetry.Err(err))
		if d.msg != nil {
			_ = d.msg.InProgress() // keep the server from re-delivering it meanwhile
		}
		if sleep(ctx, c.cfg.RetryBackoff) != nil {
			return false
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
