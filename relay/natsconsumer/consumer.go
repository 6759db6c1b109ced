package natsconsumer

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/failure"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/ratelog"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
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
	// tried again (unless its error is marked failure.Permanent: that stops
	// Run and RunProjection, see HandlerError). Defaults to 500ms.
	RetryBackoff time.Duration
	// Schema is the schema of the checkpoint table RunProjection keeps in the
	// service's database ("<schema>.relay_checkpoints", created if
	// missing, one consumer at a time: see the package doc), and the annals
	// schema whose read_model_setups table records a projection's setup
	// (see RunProjection). Defaults to "annals".
	Schema string
	// Logger receives handler failures, the stream found made again, and
	// (the default OnGap) gaps. Defaults to warnings and errors on
	// slog.Default() (information and debug records dropped).
	Logger *slog.Logger
	// OnGap is called when the stream no longer holds messages the consumer
	// has not handled yet (removed by the stream's MaxAge, MaxMsgs or
	// MaxBytes, or deleted), before the consumer handles anything after
	// them. Returning nil passes over them; an error stops Run or
	// RunProjection, which return it (errors.Is matches it) without moving
	// past the gap. The next RunProjection reports it again (its checkpoint
	// is left before the gap). The next Run reports it again only while the
	// server keeps the durable consumer's acknowledgement floor (Run's
	// place between runs) before it: once the stream removes the messages
	// that were delivered after the gap too, the server drops them after
	// AckWait and moves the floor past them, and the next Run reports only
	// what is missing after that. Record the gap here, or use RunProjection,
	// when none may go unreported. Defaults to logging the gap at ERROR
	// level on Logger and passing over it.
	OnGap func(ctx context.Context, g Gap) error
}

// Gap is a run of stream messages a consumer did not handle because the
// stream no longer held them when it got there (Config.OnGap).
type Gap struct {
	// Consumer is the durable consumer (Config.Durable).
	Consumer string
	// Stream is the stream (Config.Stream).
	Stream string
	// First and Last are the stream sequences of the first and the last
	// missing message.
	First, Last uint64
	// Count is how many messages are missing: Last - First + 1.
	Count uint64
	// After is the position (eventstore.Event.GlobalSequence) of the last
	// event the consumer handled before the gap; 0 when none or unknown.
	After int64
}

// ErrHandlerFailed is matched (errors.Is) by the error Run and RunProjection
// return when the handler failed on an event with an error marked
// failure.Permanent; errors.As with *HandlerError says which event, and
// errors.Is also matches the handler's own error (and
// failure.ErrPermanent).
var ErrHandlerFailed = errors.New("natsconsumer: a handler failed permanently")

// HandlerError reports an event whose handler (Run's function,
// RunProjection's Handle) returned an error marked failure.Permanent. Run
// or RunProjection stopped before the event: it was not acknowledged
// (handed back, with the fetched messages after it), RunProjection's
// transaction was rolled back and its checkpoint left before it, so the
// next Run or RunProjection starts at that event again.
type HandlerError struct {
	// Consumer is the durable consumer (Config.Durable), Stream the stream
	// (Config.Stream).
	Consumer, Stream string
	// Sequence is the event's stream sequence.
	Sequence uint64
	// Position (eventstore.Event.GlobalSequence), EventID, Type and
	// StreamID identify the event.
	Position int64
	EventID  uuid.UUID
	Type     string
	StreamID string
	// Err is the handler's error.
	Err error
}

func (e *HandlerError) Error() string {
	return fmt.Sprintf("natsconsumer: consumer %s: the handler failed permanently on event %s (%s, stream %q, position %d; stream message %d of %s), stopped before it: %v",
		e.Consumer, e.EventID, e.Type, e.StreamID, e.Position, e.Sequence, e.Stream, e.Err)
}

// Unwrap returns the handler's error.
func (e *HandlerError) Unwrap() error { return e.Err }

// Is makes errors.Is match ErrHandlerFailed.
func (e *HandlerError) Is(target error) bool { return target == ErrHandlerFailed }

// ErrLogRewound is matched (errors.Is) by the error Run and RunProjection
// return when the relayed log is not the one the consumer followed: the
// relay made its stream again after it found the log rewound, and the
// consumer's last position handled is past where the old stream and the
// log agree (the new stream's stamp, relay.Rewinds), or a stream made
// again holds, at the position of the last event handled, another event
// (errors.As with *RewoundError says which). The source
// database was restored from a backup or failed over to a replica that
// lacked its newest events, and it gave their positions to new events:
// the consumer's read model holds events the log no longer has, and the
// new events at those positions would be passed over. Rebuild the read
// model (docs/operations.md, "Backups, restores and failover").
var ErrLogRewound = errors.New("natsconsumer: the relayed log was rewound")

// RewoundError reports what showed the relayed log rewound (see
// ErrLogRewound): the stamp of a stream made again (Stamped), or an event.
// Run or RunProjection stopped before reading the new stream, or before
// that event: nothing of the new stream was acknowledged, or that event
// was not (handed back, with the fetched messages after it), and the
// checkpoint is left where it was, so the next start stops there again.
type RewoundError struct {
	// Consumer is the durable consumer (Config.Durable), Stream the stream
	// (Config.Stream).
	Consumer, Stream string
	// Sequence is the stream sequence of the event found (0 when
	// Stamped).
	Sequence uint64
	// Position is the position of the last event handled; Handled its ID
	// (uuid.Nil: unknown), Found the ID of the event the stream holds there
	// now (uuid.Nil when Stamped).
	Position       int64
	Handled, Found uuid.UUID
	// Stamped is set when the stop came from the stamp of the stream made
	// again (relay.Rewinds), as the consumer moved to it: Agreed is the
	// last position at which the stream the relay found rewound, made at
	// Was, and the log agree, below Position; of the streams found rewound
	// that were made no later than the one of the consumer's place, the one
	// that agrees least far. (Stamped false: Agreed and Was are zero.)
	Stamped bool
	Agreed  int64
	Was     time.Time
}

func (e *RewoundError) Error() string {
	if e.Stamped {
		return fmt.Sprintf("natsconsumer: consumer %s: the relayed log was rewound: the relay made stream %s anew after it found the log rewound under the stream made at %s, "+
			"which agrees with the log only up to position %d, but the last event handled is at position %d (%s): the events handled after %d are not the log's, "+
			"and the new stream's events at their positions would be passed over; "+
			"the source database was restored or failed over and gave the positions of events it lost to new ones: rebuild the read model (stopped before reading the new stream)",
			e.Consumer, e.Stream, e.Was.Format(time.RFC3339Nano), e.Agreed, e.Position, e.Handled, e.Agreed)
	}
	return fmt.Sprintf("natsconsumer: consumer %s: the relayed log was rewound: stream %s holds, at position %d (stream message %d), event %s, but the last event handled there was %s; "+
		"the source database was restored or failed over and gave the positions of events it lost to new ones: rebuild the read model (stopped before it)",
		e.Consumer, e.Stream, e.Position, e.Sequence, e.Found, e.Handled)
}

// Is makes errors.Is match ErrLogRewound.
func (e *RewoundError) Is(target error) bool { return target == ErrLogRewound }

// ErrNoStream is matched (errors.Is) by the error New, Run and
// RunProjection return when the NATS server has no stream by the name
// (Config.Stream) at their start: the relay has not made it yet (it makes
// it when it starts: annals relay nats, relay.Relay.Run, or
// relay.Relay.EnsureStream), or Config.Stream names another stream than
// the relay's (relay.Config.Stream). Start the relay first, or retry.
// (A stream that goes missing while Run or RunProjection runs is waited
// for: the relay makes it again.)
var ErrNoStream = errors.New("natsconsumer: the relay's stream does not exist")

// noStream marks err, from a request about stream name, with ErrNoStream
// and the way out, when it says that the stream does not exist.
func noStream(err error, name string) error {
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	return errors.Mark(errors.Wrapf(err, "natsconsumer: the NATS server has no stream %s: the relay makes it when it starts "+
		"(annals relay nats, relay.Relay.Run, or relay.Relay.EnsureStream); start the relay first, "+
		"or check that Config.Stream is the relay's stream (relay.Config.Stream, annals relay nats --stream)", name), ErrNoStream)
}

// Consumer reads relayed events from a durable JetStream consumer.
type Consumer struct {
	cfg    Config
	js     jetstream.JetStream
	filter catchup.Filter
}

// New creates (or updates) the durable consumer on the relay's stream and
// returns a Consumer reading it. The consumer takes the whole stream, in
// order, acknowledging explicitly; Types are filtered here, not on the
// server, so the stream's sequence stays gap-free for the order check.
// When the server has no stream by the name (the relay not started yet, or
// Config.Stream not the relay's), New fails at once with ErrNoStream, which
// says so, rather than waiting: a mistaken name would wait silently for
// ever. Start the relay first, or retry New while errors.Is(err,
// ErrNoStream). A stream that goes missing later, under Run or
// RunProjection, is waited for (the relay makes it again).
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
		c.Logger = telemetry.DefaultLogger()
	}
	if c.OnGap == nil {
		logger := c.Logger
		c.OnGap = func(ctx context.Context, g Gap) error {
			logger.ErrorContext(ctx, "annals: the relay's stream no longer holds messages this consumer had not handled (removed by a stream limit, or deleted); passing over them",
				slog.String("consumer", g.Consumer), slog.String("stream", g.Stream),
				slog.Uint64("first", g.First), slog.Uint64("last", g.Last), slog.Uint64("count", g.Count),
				slog.Int64("after_position", g.After))
			return nil
		}
	}
	filter, err := catchup.ParseFilter(c.Types)
	if err != nil {
		return nil, errors.Wrap(err, "natsconsumer")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, errors.Wrap(err, "natsconsumer: JetStream")
	}
	cons := &Consumer{cfg: c, js: js, filter: filter}
	if err := (&session{c: cons}).attach(ctx); err != nil {
		return nil, err
	}
	return cons, nil
}

// session is one Run or RunProjection: the stream and durable consumer it
// reads, and its place.
type session struct {
	c      *Consumer
	stream jetstream.Stream
	cons   jetstream.Consumer
	// created is when the stream was made (its incarnation: a stream made
	// again under the same name starts its sequence again); zero before the
	// first attach when unknown.
	created time.Time
	// seq is the stream sequence (of the stream made at created) handled
	// through, and pos the position of the last event handled (0: none or
	// unknown).
	seq uint64
	pos int64
	// posID is the ID of the event at pos (uuid.Nil: unknown, as for a
	// checkpoint saved before it was kept): an event at pos with another
	// ID shows the log rewound (ErrLogRewound).
	posID uuid.UUID
	// held is set when messages after seq may be held unacknowledged by a
	// process that fetched them and died (the server showed messages
	// pending at attach, or a delivery came after messages this session
	// never got), or were acknowledged past seq (a checkpoint set back:
	// the server showed them delivered at attach): an empty fetch then
	// asks the server about the consumer (see behind), and run's first
	// fetch does not wait. A consumer nobody else holds messages of costs one
	// request (its fetch) per empty fetch.
	held bool
	// handle handles one delivery (RunProjection: and saves the place).
	handle func(context.Context, delivery) error
	// lost is the run of failed look-ups of the stream and the durable
	// consumer (see reattach); none while attached.
	lost ratelog.Run
	// down is the run of failed requests to the NATS server (a fetch's
	// error, the consumer's or the stream's info, a read by sequence; see
	// requestFailed); none while the server answers.
	down ratelog.Run
}

// Pauses of reattach while the stream or the durable consumer cannot be
// found: from Config.RetryBackoff, doubled after each failure up to
// maxLostBackoff; the failure is logged at WARN at its first and then at
// most once a minute (a ratelog.Run).
const maxLostBackoff = 5 * time.Second

// attach looks the stream up by name and creates (or updates) the durable
// consumer on it. A stream made after the one the session's place belongs
// to (deleted and made again by the relay) is read from its start: the
// sequence is reset, the position kept; unless its stamp (relay.Rewinds)
// says that the log was rewound under a stream not newer than the place's
// that agrees with it only up to a position below the place's: then attach
// returns a stop of a *RewoundError, before it makes the durable consumer
// on the new stream or reads any of it. (New's attach knows no place, so
// on a restart it has made the durable consumer on the new stream before
// RunProjection's attach stops: nothing is delivered or acknowledged
// there.)
func (s *session) attach(ctx context.Context) error {
	cfg := &s.c.cfg
	rctx, cancel := request(ctx)
	defer cancel()
	stream, err := s.c.js.Stream(rctx, cfg.Stream)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return noStream(err, cfg.Stream)
		}
		return errors.Wrapf(err, "natsconsumer: stream %s", cfg.Stream)
	}
	if !s.created.IsZero() && !sameStream(s.created, stream.CachedInfo().Created) {
		if err := s.stamped(ctx, stream.CachedInfo().Config.Metadata); err != nil {
			return err
		}
	}
	cons, err := stream.CreateOrUpdateConsumer(rctx, jetstream.ConsumerConfig{
		Durable: cfg.Durable, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait: cfg.AckWait, MaxAckPending: cfg.Batch,
	})
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) { // deleted since the look-up
			return noStream(err, cfg.Stream)
		}
		return errors.Wrapf(err, "natsconsumer: consumer %s", cfg.Durable)
	}
	created := stream.CachedInfo().Created
	if !s.created.IsZero() && !sameStream(s.created, created) {
		cfg.Logger.WarnContext(ctx, "annals: the relay's JetStream stream was made again; reading the new one from its start, passing over the events at or below the last position handled. "+
			"Events the old stream held after that position, if any, are not in the new one",
			slog.String("consumer", cfg.Durable), slog.String("stream", cfg.Stream),
			slog.Time("old_created", s.created), slog.Time("new_created", created), slog.Int64("position", s.pos))
		s.seq = 0
	}
	s.stream, s.cons, s.created = stream, cons, created
	s.held = held(cons.CachedInfo(), s.seq)
	return nil
}

// held reports whether the server may hold, past seq, messages that no
// fetch will bring (see session.held): messages it delivered and awaits the
// acknowledgement of (a process fetched them and died), or messages it
// delivered past seq at all: a checkpoint behind the durable consumer's
// acknowledgement floor (its row deleted to rebuild the read model, or the
// service's database restored from a dump older than the
// acknowledgements), whose messages the server takes as handled and never
// delivers again.
func held(info *jetstream.ConsumerInfo, seq uint64) bool {
	return info.NumAckPending > 0 || info.Delivered.Stream > seq
}

// stamped judges the stamp (relay.Rewinds) of a stream made again, which
// the session moves to from the one made at s.created: a stop of a
// *RewoundError, logged at ERROR, when the log was rewound under a stream
// made no later than the place's (the place is in it, or in one before
// it) that agrees with it only up to a position below the place's; of
// those, the lowest is named (relay.Rewinds.Since). A consumer placed in a
// stream made before two rewinds (offline through both) is judged by the
// lower of the two, though the stream it moves to was made after the
// second. An unreadable stamp is taken as agreeing nowhere (position 0).
func (s *session) stamped(ctx context.Context, metadata map[string]string) error {
	rs, _, err := relay.RewindsOf(metadata)
	rw, found := rs.Since(s.created) // none without a stamp
	if err != nil {
		s.c.cfg.Logger.WarnContext(ctx, "annals: the relay's stream made again has a rewind stamp that does not parse; taken as agreeing with the log nowhere",
			slog.String("consumer", s.c.cfg.Durable), slog.String("stream", s.c.cfg.Stream), telemetry.Err(err))
		rw, found = relay.Rewound{}, true
	}
	if !found || s.pos <= rw.At {
		return nil
	}
	rerr := &RewoundError{Consumer: s.c.cfg.Durable, Stream: s.c.cfg.Stream, Position: s.pos, Handled: s.posID,
		Stamped: true, Agreed: rw.At, Was: rw.Created}
	s.c.cfg.Logger.ErrorContext(ctx, "annals: the relayed log was rewound; stopping", telemetry.Err(rerr),
		slog.String("consumer", s.c.cfg.Durable), slog.Int64("position", s.pos), slog.Int64("agreed_position", rw.At))
	return stop{rerr}
}

// sameStream reports whether two creation times are of one stream, to the
// microsecond the checkpoint table keeps.
func sameStream(a, b time.Time) bool {
	return a.Truncate(time.Microsecond).Equal(b.Truncate(time.Microsecond))
}

// errRemade is marked on the error of a read that found the stream made
// again under the session.
var errRemade = errors.New("natsconsumer: the stream was made again")

// gone reports whether err says that the stream or the durable consumer the
// session reads is no longer there (deleted, or made again), so that it
// must look them up again.
func gone(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, errRemade)
}

// stop is an error that ends run (OnGap refused a gap, or a handler failed
// permanently), unlike the failures run retries.
type stop struct{ err error }

func (s stop) Error() string { return s.err.Error() }

// delivery is one fetched message and its event.
type delivery struct {
	msg   jetstream.Msg
	seq   uint64
	event eventstore.Event
}

// fetch asks the server for the next messages (up to Batch): those it has
// at once when noWait, else those it delivers within fetchWait. They come
// on the batch's channel as the server delivers them (see take), not when
// the fetch ends.
func (s *session) fetch(noWait bool) (jetstream.MessageBatch, error) {
	var batch jetstream.MessageBatch
	var err error
	if noWait {
		batch, err = s.cons.FetchNoWait(s.c.cfg.Batch)
	} else {
		batch, err = s.cons.Fetch(s.c.cfg.Batch, jetstream.FetchMaxWait(fetchWait))
	}
	return batch, errors.Wrap(err, "natsconsumer: fetch")
}

// fetchWait is how long a fetch's pull request waits on the server for
// messages (its expiry): a consumer idle or behind a trickle of events
// makes one a second. Messages are handled as they arrive, so it bounds
// no latency; nats.go gives up on a pull request whose end never came a
// second after its expiry.
const fetchWait = time.Second

// toDelivery returns the delivery of m, a fetched message.
func (s *session) toDelivery(m jetstream.Msg) (delivery, error) {
	md, err := m.Metadata()
	if err != nil {
		return delivery{}, errors.Wrap(err, "natsconsumer: message metadata")
	}
	e, err := s.c.decode(md.Sequence.Stream, m.Headers(), m.Data())
	if err != nil {
		return delivery{}, err
	}
	return delivery{msg: m, seq: md.Sequence.Stream, event: e}, nil
}

// take handles the messages of batch in order as they arrive (deliver),
// until the fetch ends (n is how many came, ferr the fetch's error), ctx
// ends, or a delivery is not handled: then the message and the rest of
// the batch, those still to arrive too, are handed back (handBack), and
// err is the delivery's failure when run must end with it (see failed).
// The messages behind one whose handler fails and is retried wait in the
// batch (they are handled after it, not fetched again). A message that
// does not decode ends the batch (handed back with the rest) with ferr.
func (s *session) take(ctx context.Context, batch jetstream.MessageBatch) (n int, ferr, err error) {
	msgs := batch.Messages()
	for {
		var m jetstream.Msg
		var ok bool
		select {
		case m, ok = <-msgs:
		case <-ctx.Done():
			// Stopping: hand the rest back at once rather than after
			// AckWait, without waiting for the fetch to end.
			handBack(msgs)
			return n, nil, nil
		}
		if !ok {
			return n, errors.Wrap(batch.Error(), "natsconsumer: fetch"), nil
		}
		if n++; n == 1 {
			s.answered(ctx) // a message: the server answers
		}
		d, derr := s.toDelivery(m)
		if derr != nil {
			handBack(msgs, m)
			return n, derr, nil
		}
		handled, cause := s.deliver(ctx, d)
		if !handled {
			handBack(msgs, m)
			if cause != nil {
				return n, nil, s.failed(ctx, cause)
			}
			return n, nil, nil
		}
	}
}

// handBack gives the messages of a fetch that will not be handled back to
// the server unacknowledged (Nak), so that it delivers them again at once
// rather than after AckWait: taken (taken from the fetch) and every message
// the fetch still brings. The fetch's pull request stays open on the
// server until it has brought Batch messages or expires (fetchWait after it
// was made; nats.go gives up on it a second after that), and the server
// delivers to it meanwhile, whatever the consumer does; handBack does not
// wait for that: a goroutine takes the messages until the fetch ends and
// then Naks them all. (Not each as it comes: the server would deliver a
// message Nak'd while the pull request is open to it again.)
func handBack(msgs <-chan jetstream.Msg, taken ...jetstream.Msg) {
	go func() {
		for m := range msgs {
			taken = append(taken, m)
		}
		for _, m := range taken {
			_ = m.Nak()
		}
	}()
}

// decode returns the event of stream message seq, upcast.
func (c *Consumer) decode(seq uint64, h nats.Header, data []byte) (eventstore.Event, error) {
	e, err := relay.Decode(h, data)
	if err != nil {
		return e, errors.Wrapf(err, "natsconsumer: stream message %d", seq)
	}
	if c.cfg.Registry != nil {
		if e, err = c.cfg.Registry.Upcast(e); err != nil {
			return e, errors.Wrapf(err, "natsconsumer: upcast event %d", e.GlobalSequence)
		}
	}
	return e, nil
}

// Run calls handle for each relayed event whose type matches, in stream
// order, as it arrives (a live event within milliseconds of its publish),
// and acknowledges it once handle returned nil: at-least-once (a
// crash between the two delivers the event again; handle gets e.ID for
// idempotency). An acknowledgement that fails after handle returned nil
// (the NATS connection lost) is logged at WARN, not retried, and the event
// is not handled again by this Run: the server delivers it again after
// AckWait, and Run acknowledges it then without handling it (a Run started
// again before that handles it again). A failed handle is retried after
// RetryBackoff, and the events after it wait: for ever, each failure
// logged at WARN. There is no retry limit and no dead letter (unlike a
// projection.Runner's). An error marked failure.Permanent is not retried:
// Run logs it at ERROR and returns it in a *HandlerError (errors.Is
// matches ErrHandlerFailed and the handler's error), the event not
// acknowledged but handed back, so the next Run starts at it again (fix
// the handler first). It returns nil when ctx ends (at once: the messages
// its last fetch brings are handed back, as the package doc says), or
// OnGap's error, or that *HandlerError, or a *RewoundError
// (ErrLogRewound), or, at its start, ErrNoStream.
func (c *Consumer) Run(ctx context.Context, handle func(ctx context.Context, e eventstore.Event) error) error {
	s := &session{c: c}
	if err := s.attach(ctx); err != nil {
		return err
	}
	// In order from the consumer's acknowledgement floor: every message up
	// to it was handled (they are acknowledged in order).
	info, err := s.cons.Info(ctx)
	if err != nil {
		return errors.Wrapf(err, "natsconsumer: consumer %s", c.cfg.Durable)
	}
	s.seq = info.AckFloor.Stream
	s.held = held(info, s.seq)
	s.handle = func(ctx context.Context, d delivery) error {
		if c.filter.Match(d.event.Type) {
			if err := handle(ctx, d.event); err != nil {
				return err
			}
		}
		s.ack(ctx, d)
		return nil
	}
	return s.run(ctx)
}

// RunProjection runs p (the same Projection a runner in the source database
// runs) over the relayed events in this service's database: each event is
// handled in a transaction on pool that also moves the consumer's
// checkpoint (the stream sequence, the stream's creation time and the
// event's position, in "<schema>.relay_checkpoints"), so its effects are
// applied exactly once; the message is acknowledged after the commit, and a
// message at or below the checkpoint (a re-delivery) is acknowledged
// without being handled. An acknowledgement that fails after the commit is
// logged at WARN and not retried (the server delivers the message again
// after AckWait, and it is then acknowledged without being handled). A
// commit whose answer was lost (the connection failed at COMMIT) is
// retried as a failed Handle is; the retry's checkpoint save then finds
// the checkpoint at the event already, rolls its transaction back (the
// second Handle's writes discarded), logs it at WARN and takes the event
// as handled. One RunProjection per Durable at a time (run it
// leader-elected, e.g. as a projection.Service, when several instances
// run). Before it handles anything it runs the projection's read-model
// setup (Typed.OnSetup, projection.Setupper) in pool's database as a Runner
// does: once per version per database, under a lock, recorded in
// "<schema>.read_model_setups", so a projection with a setup needs the
// annals schema migrated there (else migrations.ErrNotMigrated); a typed
// projection's mistakes (Typed.Err) are returned. A failed Handle is
// retried as Run retries it: for ever, with no dead letter. An error
// marked failure.Permanent (as a typed projection marks an event it cannot
// decode) stops it as it stops Run: the transaction rolled back, the
// checkpoint left before the event, a *HandlerError returned. It returns
// nil when ctx ends (at once, as Run), or OnGap's error, or the setup's,
// or that *HandlerError, or a *RewoundError (ErrLogRewound), or, at its
// start, ErrNoStream.
//
// The retry of a commit whose answer was lost may run while the server
// has not yet run that COMMIT (its backend descheduled): its Handle then
// waits for the first attempt's rows, and a projection keyed as most are
// (a row per event) fails with a unique violation once the first attempt
// lands. So when a transaction fails before its COMMIT, the checkpoint is
// read before the failure is taken for the handler's: at or past the
// event, the event was handled, as above.
func (c *Consumer) RunProjection(ctx context.Context, pool *pgxpool.Pool, p interface {
	Name() string
	Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error
}) error {
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(c.cfg.Schema))
	if err != nil {
		return err
	}
	if err := c.ensureTable(ctx, pool, q); err != nil {
		return err
	}
	if err := c.setup(ctx, pool, p); err != nil {
		return err
	}
	var (
		seq     int64
		pos     *int64
		created *time.Time
		posID   *uuid.UUID
	)
	err = pool.QueryRow(ctx, q["Load"], c.cfg.Durable).Scan(&seq, &pos, &created, &posID)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return errors.Wrap(err, "natsconsumer: load the checkpoint")
	}
	// A checkpoint saved before the table kept the stream's creation time
	// (NULL) is taken to be of the stream as it is now.
	s := &session{c: c, seq: uint64(seq)}
	if pos != nil {
		s.pos = *pos
	}
	if created != nil {
		s.created = *created
	}
	if posID != nil {
		s.posID = *posID
	}
	if err := s.attach(ctx); err != nil {
		var st stop
		if errors.As(err, &st) {
			return st.err
		}
		return err
	}
	s.handle = func(ctx context.Context, d delivery) error {
		inTx := false // failed before its COMMIT: in the handler or the save
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			defer func() { inTx = err != nil }()
			if c.filter.Match(d.event.Type) {
				if err := p.Handle(ctx, tx, d.event); err != nil {
					return err
				}
			}
			tag, err := tx.Exec(ctx, q["Save"], c.cfg.Durable, int64(d.seq), d.event.GlobalSequence, s.created, d.event.ID)
			if err != nil || tag.RowsAffected() == 1 {
				return err
			}
			return s.unsaved(ctx, tx, q["Load"], d)
		})
		if inTx && !errors.Is(err, errHandledBefore) && ctx.Err() == nil && s.holds(ctx, pool, q["Load"], d) {
			err = errHandledBefore
		}
		switch {
		case errors.Is(err, errHandledBefore):
			c.cfg.Logger.WarnContext(ctx, "annals: the checkpoint holds this relayed event already (an earlier commit of it landed though its answer was lost, "+
				"or another RunProjection of this durable consumer applied it): not applied again, its transaction rolled back; acknowledging it",
				slog.String("consumer", c.cfg.Durable), slog.Uint64("stream_seq", d.seq), slog.Int64("position", d.event.GlobalSequence))
		case err != nil:
			return err
		}
		s.ack(ctx, d)
		return nil
	}
	return s.run(ctx)
}

// errHandledBefore is returned in RunProjection's transaction for an event
// the checkpoint holds already (see unsaved): the transaction is rolled
// back, and the event taken as handled.
var errHandledBefore = errors.New("natsconsumer: the checkpoint holds the event already")

// unsaved says why RunProjection's checkpoint save for d changed no row (the
// save moves it only forward within one stream), reading the checkpoint in
// the same transaction tx with load: errHandledBefore when it is at or past
// d in the same stream (d was applied and committed before: a commit whose
// answer was lost, then retried, or a re-delivery to a second
// RunProjection of the durable consumer), else an error saying what it
// holds.
func (s *session) unsaved(ctx context.Context, tx pgx.Tx, load string, d delivery) error {
	var (
		seq     int64
		pos     *int64
		created *time.Time
		posID   *uuid.UUID
	)
	err := tx.QueryRow(ctx, load, s.c.cfg.Durable).Scan(&seq, &pos, &created, &posID)
	if errors.Is(err, pgx.ErrNoRows) {
		return errors.Newf("natsconsumer: checkpoint of %s moved under us: saving it at stream message %d changed no row, and there is none", s.c.cfg.Durable, d.seq)
	}
	if err != nil {
		return errors.Wrap(err, "natsconsumer: read the checkpoint")
	}
	if created != nil && sameStream(*created, s.created) && uint64(seq) >= d.seq {
		return errHandledBefore
	}
	at, made := "unknown", "unknown"
	if pos != nil {
		at = fmt.Sprint(*pos)
	}
	if created != nil {
		made = created.Format(time.RFC3339Nano)
	}
	return errors.Newf("natsconsumer: checkpoint of %s moved under us: saving it at stream message %d (position %d) of the stream made at %s changed nothing; it holds stream message %d (position %s) of the stream made at %s",
		s.c.cfg.Durable, d.seq, d.event.GlobalSequence, s.created.Format(time.RFC3339Nano), seq, at, made)
}

// holds reports whether the checkpoint, read with load on pool, is at or
// past d in the same stream: d was applied and committed before. It is
// asked after a transaction for d failed before its COMMIT, before the
// failure is taken for the handler's: the retry of a commit whose answer
// was lost, which the server ran late, while the retry's handler ran,
// fails in the handler when the projection's rows are keyed (a unique
// violation, once the first attempt's row it waited for committed),
// before its checkpoint save would have told (unsaved). A failed read
// answers false: the failure stands, and the event is tried again.
func (s *session) holds(ctx context.Context, pool *pgxpool.Pool, load string, d delivery) bool {
	var (
		seq     int64
		pos     *int64
		created *time.Time
		posID   *uuid.UUID
	)
	if err := pool.QueryRow(ctx, load, s.c.cfg.Durable).Scan(&seq, &pos, &created, &posID); err != nil {
		return false
	}
	return created != nil && sameStream(*created, s.created) && uint64(seq) >= d.seq
}

// ensureTable makes the checkpoint table unless it is there with every
// column (TableReady, a query). Else it makes the schema and the table, or
// adds the columns a table made before them lacks, in one READ COMMITTED
// transaction under an advisory lock on the schema's key (Lock,
// CreateTable): consumers starting at once (replicas, a service's
// projections) on a database without it make it one after the other, as
// CREATE ... IF NOT EXISTS alone fails for the loser of a concurrent
// creation.
func (c *Consumer) ensureTable(ctx context.Context, pool *pgxpool.Pool, q map[string]string) error {
	var ready bool
	if err := pool.QueryRow(ctx, q["TableReady"]).Scan(&ready); err != nil {
		return errors.Wrap(err, "natsconsumer: look for the checkpoint table")
	}
	if ready {
		return nil
	}
	k1, k2 := lockkey.Pair(c.cfg.Schema + ":relay-checkpoints")
	err := pgx.BeginTxFunc(ctx, pool, pgtx.ReadCommitted, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, q["Lock"], k1, k2); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, q["CreateTable"])
		return err
	})
	return errors.Wrap(err, "natsconsumer: create the checkpoint table")
}

// setup reports the mistakes of a typed projection (Err), as
// projection.Runner.Register does, and runs the projection's read-model
// setup (projection.Setupper: Typed.OnSetup) in the service's database as
// a Runner does (projection.EnsureSetup): once per version per database,
// under the projection's setup lock, recorded in
// "<schema>.read_model_setups" (where a Runner of that database records
// it too), so an annals schema migrated there is needed. A schema without
// that table fails with migrations.ErrNotMigrated before the setup runs.
func (c *Consumer) setup(ctx context.Context, pool *pgxpool.Pool, p interface{ Name() string }) error {
	if e, ok := p.(interface{ Err() error }); ok && e.Err() != nil {
		return errors.Wrapf(e.Err(), "natsconsumer: projection %q", p.Name())
	}
	s, ok := p.(projection.Setupper)
	if !ok || s.SetupVersion() <= 0 {
		return nil
	}
	var ran bool
	err := pgx.BeginTxFunc(ctx, pool, pgtx.ReadCommitted, func(tx pgx.Tx) error {
		var err error
		ran, err = projection.EnsureSetup(ctx, tx, c.cfg.Schema, p.Name(), s, "natsconsumer:"+c.cfg.Durable)
		return err
	})
	if migrations.IsNotMigrated(err) {
		return errors.Wrapf(migrations.MarkNotMigrated(err), "natsconsumer: projection %q has a setup (OnSetup), whose version is recorded in %s.read_model_setups "+
			"of the service's database as a Runner records it: run 'annals migrate' (or migrations.Up) on that database, schema %s",
			p.Name(), c.cfg.Schema, c.cfg.Schema)
	}
	if err != nil {
		return errors.Wrap(err, "natsconsumer: setup")
	}
	if ran {
		c.cfg.Logger.InfoContext(ctx, "annals: read model set up", slog.String("projection", p.Name()),
			slog.Int("version", s.SetupVersion()), slog.String("consumer", c.cfg.Durable))
	}
	return nil
}

// ack acknowledges the delivery's message; one read from the stream by
// sequence (see fill) has none.
func (d delivery) ack() error {
	if d.msg == nil {
		return nil
	}
	return d.msg.Ack()
}

// ack acknowledges d once it was handled (RunProjection: committed). A
// failure (the NATS connection lost, say) is not the handler's: it is
// logged at WARN and the session goes on, the event not handled again. The
// server delivers the message again after AckWait, and it is then at or
// below the place, so acknowledged without being handled. (A Run started
// again before that starts at the acknowledgement floor, before it, and
// handles it again: at least once.)
func (s *session) ack(ctx context.Context, d delivery) {
	if err := d.ack(); err != nil {
		s.c.cfg.Logger.WarnContext(ctx, "annals: acknowledging a relayed event failed after it was handled; not handling it again: "+
			"the server delivers it again after AckWait, and it is then acknowledged without being handled (it is at or below the consumer's place)",
			slog.String("consumer", s.c.cfg.Durable), slog.Uint64("stream_seq", d.seq), slog.Int64("position", d.event.GlobalSequence),
			telemetry.Err(err))
	}
}

// run fetches and handles in stream order, from the sequence after s.seq
// (RunProjection: its checkpoint; Run: the consumer's acknowledgement
// floor), which it moves as each message is handled. Each fetched message
// is handled as it arrives (take), not when its fetch ends: a pull request
// for Batch messages stays open on the server until they came or it
// expires, a second after it was made. A message at or below
// s.seq was handled already (a re-delivery) and is acknowledged. A message
// further than one past s.seq means that the ones before it are still
// unacknowledged somewhere: a process that fetched them crashed, and the
// server will send them again only after AckWait, behind whatever it
// delivers meanwhile (and behind it again after each Nak). Rather than wait
// for that order, fill reads the missing messages from the stream by
// sequence and handles them first; their re-deliveries come later, at or
// below s.seq. A fetch that returns nothing while messages may be held
// elsewhere (s.held) looks at the consumer on the server (behind): the
// messages it delivered past s.seq (to the crashed process) are read by
// sequence, and so, when it holds as many unacknowledged as it lets out
// (it delivers nothing newer until AckWait), are those after them, Batch
// at a time. An empty fetch otherwise costs nothing more: a message
// published just after it is delivered by the next one, not read by
// sequence and then delivered again. A failed delivery is retried in
// place after RetryBackoff; the rest of the fetched batch waits (it is
// handled after it, not re-fetched); one failed permanently ends run with
// a *HandlerError, the rest of the batch handed back, those of its
// messages still to come too (handBack). A stream or consumer
// found gone (or the stream made again) is looked up again by name. When
// ctx ends run returns at once, the open fetch's messages handed back
// (handBack) as they come.
func (s *session) run(ctx context.Context) error {
	// Held messages are looked for at once (the first fetch does not wait
	// for new ones): a checkpoint behind the server's place catches up on
	// an idle stream without waiting out a fetch.
	noWait := s.held
	for ctx.Err() == nil {
		var n int
		batch, ferr := s.fetch(noWait)
		noWait = false
		if ferr == nil {
			var err error
			if n, ferr, err = s.take(ctx, batch); err != nil {
				return err
			}
		}
		if ferr == nil && n == 0 && s.c.js.Conn().Status() == nats.CONNECTED {
			// A fetch that returned nothing says nothing of the server
			// while the connection is down: it ends empty on its own.
			s.answered(ctx)
		}
		switch {
		case ctx.Err() != nil:
		case ferr != nil && gone(ferr):
			if err := s.reattach(ctx, ferr); err != nil {
				return err
			}
		case ferr != nil && !errors.Is(ferr, nats.ErrTimeout):
			s.requestFailed(ctx, "annals: fetching relayed events failed", ferr)
			_ = sleep(ctx, s.c.cfg.RetryBackoff)
		case n == 0 && s.held:
			more, err := s.behind(ctx)
			if err != nil {
				if err := s.failed(ctx, err); err != nil {
					return err
				}
			} else {
				s.answered(ctx)
			}
			noWait = more
		}
	}
	return nil
}

// deliver handles d, a fetched message, in order (see run). It reports
// whether d was handled (or acknowledged as a re-delivery); when not, the
// caller hands it back with the rest of its batch, and cause, when not
// nil, is the failure of fill or handleOne, for failed (nil: ctx ended).
func (s *session) deliver(ctx context.Context, d delivery) (handled bool, cause error) {
	if ctx.Err() != nil {
		return false, nil
	}
	if d.seq <= s.seq {
		_ = d.msg.Ack()
		return true, nil
	}
	if d.seq > s.seq+1 {
		if _, err := s.fill(ctx, d.seq, 0); err != nil {
			return false, err
		}
	}
	if err := s.handleOne(ctx, d); err != nil {
		return false, err
	}
	return true, nil
}

// failed deals with fill's error or handleOne's: a stop (OnGap's error, a
// handler's permanent failure) is returned (run ends with it); a gone
// stream is looked up again; anything else is logged (requestFailed: a
// WARN at most once a minute while it goes on), and retried after
// RetryBackoff.
func (s *session) failed(ctx context.Context, err error) error {
	var st stop
	switch {
	case errors.As(err, &st):
		return st.err
	case ctx.Err() != nil:
	case gone(err):
		return s.reattach(ctx, err)
	default:
		s.requestFailed(ctx, "annals: reading relayed events from the stream failed; retrying", err, slog.Uint64("after", s.seq))
		_ = sleep(ctx, s.c.cfg.RetryBackoff)
	}
	return nil
}

// requestFailed logs err, a failed request of run to the NATS server, as
// msg: at WARN the first time and then at most once a minute, at DEBUG
// between, with the attempts so far and how long requests have been
// failing (the rule of handler retries and of reattach). A NATS outage
// fails a request every requestTimeout plus RetryBackoff, which logged
// about ten WARNs a minute for as long as it lasted. answered ends the run.
func (s *session) requestFailed(ctx context.Context, msg string, err error, attrs ...any) {
	level := s.down.Failed()
	attrs = append([]any{slog.String("consumer", s.c.cfg.Durable)}, attrs...)
	attrs = append(attrs, slog.Int("attempts", s.down.Count()),
		slog.Duration("failing_for", s.down.For().Round(time.Millisecond)), telemetry.Err(s.c.unreachable(err)))
	s.c.cfg.Logger.Log(ctx, level, msg, attrs...)
}

// answered ends a run of failed requests to the NATS server (see
// requestFailed) when the server answers one again, at INFO.
func (s *session) answered(ctx context.Context) {
	if n, lasted, ok := s.down.Recovered(); ok {
		s.c.cfg.Logger.InfoContext(ctx, "annals: the NATS server answers the consumer's requests again",
			slog.String("consumer", s.c.cfg.Durable), slog.Int("attempts", n),
			slog.Duration("failing_for", lasted.Round(time.Millisecond)))
	}
}

// reattach looks the stream and the durable consumer up again after cause
// said they were gone. When that fails too it pauses (run tries again at
// its next fetch): Config.RetryBackoff, doubled after each failure in a row
// up to maxLostBackoff; it logs the failure at WARN at the first and at
// most once a minute after, saying that the stream is missing when
// the server has none by the name (ErrNoStream: deleted, or lost with the
// server's store, until the relay makes it again), and at DEBUG in
// between; at INFO when the look-up succeeds again. It returns an error only when run must end with
// it (the stamp of the stream made again: ErrLogRewound).
func (s *session) reattach(ctx context.Context, cause error) error {
	cfg := &s.c.cfg
	err := s.attach(ctx)
	if err == nil {
		if n, lasted, ok := s.lost.Recovered(); ok {
			cfg.Logger.InfoContext(ctx, "annals: the relay's stream and the durable consumer are found again",
				slog.String("consumer", cfg.Durable), slog.String("stream", cfg.Stream),
				slog.Duration("missing_for", lasted.Round(time.Millisecond)), slog.Int("attempts", n))
		}
		return nil
	}
	var st stop
	if errors.As(err, &st) {
		return st.err
	}
	if ctx.Err() != nil {
		return nil
	}
	level := s.lost.Failed()
	pause := cfg.RetryBackoff
	for i := 1; i < s.lost.Count() && pause < maxLostBackoff; i++ {
		pause *= 2
	}
	pause = max(min(pause, maxLostBackoff), cfg.RetryBackoff)
	attrs := []any{slog.String("consumer", cfg.Durable), slog.String("stream", cfg.Stream),
		slog.Time("since", s.lost.Since()), slog.Int("attempts", s.lost.Count()), slog.Duration("retry_in", pause),
		slog.String("cause", cause.Error())}
	const failed = "annals: the relay's stream or the durable consumer is gone; looking them up again failed, retrying"
	switch {
	case level < slog.LevelWarn:
		cfg.Logger.DebugContext(ctx, failed, append(attrs, telemetry.Err(err))...)
	case errors.Is(err, ErrNoStream):
		cfg.Logger.WarnContext(ctx, "annals: the relay's stream is missing (deleted, or lost with the NATS server's store); waiting for the relay to make it again "+
			"(at its start or next leadership), looking it up with backoff",
			append(attrs, telemetry.Err(errors.UnwrapAll(err)))...) // the server's answer, not noStream's advice to start the relay
	default:
		cfg.Logger.WarnContext(ctx, failed, append(attrs, telemetry.Err(err))...)
	}
	_ = sleep(ctx, pause)
	return nil
}

// handleOne handles d (see handle) and moves the place past it. An event at
// or below the last position handled (published again into a stream made
// again) is acknowledged without being handled. It returns ctx's error when
// ctx ended first, and a stop when the handler failed permanently (the
// place left before d).
func (s *session) handleOne(ctx context.Context, d delivery) error {
	if d.event.GlobalSequence == s.pos && s.posID != uuid.Nil && d.event.ID != s.posID {
		err := &RewoundError{Consumer: s.c.cfg.Durable, Stream: s.c.cfg.Stream, Sequence: d.seq,
			Position: s.pos, Handled: s.posID, Found: d.event.ID}
		s.c.cfg.Logger.ErrorContext(ctx, "annals: the relayed log was rewound; stopping", telemetry.Err(err))
		return stop{err}
	}
	if d.event.GlobalSequence <= s.pos {
		if err := d.ack(); err != nil {
			s.c.cfg.Logger.DebugContext(ctx, "annals: acknowledging a relayed event handled before failed", telemetry.Err(err))
		}
		s.seq = d.seq
		return nil
	}
	if err := s.c.handle(ctx, d, s.handle); err != nil {
		return err
	}
	s.seq, s.pos, s.posID = d.seq, d.event.GlobalSequence, d.event.ID
	return nil
}

// behind deals with an empty fetch while messages may be held elsewhere
// (s.held): it asks the server about the consumer. Messages it delivered
// past s.seq went to a process that died (this session handled all it
// got); when, besides, the server holds as many messages unacknowledged as
// it lets out (MaxAckPending), it delivers nothing newer until AckWait. So
// it reads by sequence, Batch at a time (more: it stopped short), the
// delivered ones, and when the server is full the stream's newer ones too.
// When the server delivered nothing past s.seq and is not full, s.held is
// cleared: what it delivers next comes to the fetch.
func (s *session) behind(ctx context.Context) (more bool, err error) {
	rctx, cancel := request(ctx)
	info, err := s.cons.Info(rctx)
	cancel()
	if err != nil {
		return false, errors.Wrapf(err, "natsconsumer: consumer %s", s.c.cfg.Durable)
	}
	full := info.Config.MaxAckPending > 0 && info.NumAckPending >= info.Config.MaxAckPending
	switch {
	case full && info.NumPending > 0:
		return s.fill(ctx, 0, s.c.cfg.Batch)
	case info.Delivered.Stream > s.seq:
		return s.fill(ctx, info.Delivered.Stream+1, s.c.cfg.Batch)
	case !full:
		s.held = false
	}
	return false, nil
}

// fill handles, in order, the messages the stream holds after s.seq and
// before upto (0: through the stream's last message), read by sequence;
// limit > 0 stops it after that many reads (more reports that it stopped
// short). Each read asks for the stream's first message at or after a
// sequence, so a run of messages the stream no longer holds (removed by a
// limit, deleted) costs one read, and is reported to OnGap as one Gap
// before anything after it is handled. A message read here was held
// unacknowledged by another process (or acknowledged past a checkpoint
// set back): s.held is set.
func (s *session) fill(ctx context.Context, upto uint64, limit int) (more bool, err error) {
	rctx, cancel := request(ctx)
	info, err := s.stream.Info(rctx)
	cancel()
	if err != nil {
		return false, errors.Wrapf(err, "natsconsumer: stream %s", s.c.cfg.Stream)
	}
	if !sameStream(info.Created, s.created) {
		return false, errors.Mark(errors.Newf("natsconsumer: stream %s was made again (at %s)", s.c.cfg.Stream, info.Created), errRemade)
	}
	end := upto // exclusive
	if end == 0 {
		end = info.State.LastSeq + 1
	}
	for n := 0; s.seq+1 < end; n++ {
		if limit > 0 && n == limit {
			return true, nil
		}
		next := s.seq + 1
		rctx, cancel := request(ctx)
		m, err := s.stream.GetMsg(rctx, next, jetstream.WithGetMsgSubject(">"))
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, errors.Wrapf(err, "natsconsumer: read stream message %d", next)
		}
		seq := end // the stream's first message at or after next; end: none before end
		if err == nil && m.Sequence < end {
			seq = m.Sequence
		}
		if seq > next {
			if err := s.gap(ctx, next, seq-1); err != nil {
				return false, err
			}
			s.seq = seq - 1
		}
		if seq == end {
			break
		}
		e, err := s.c.decode(seq, m.Header, m.Data)
		if err != nil {
			return false, err
		}
		s.held = true
		if err := s.handleOne(ctx, delivery{seq: seq, event: e}); err != nil {
			return false, err
		}
	}
	return false, nil
}

// gap reports the missing stream messages first to last to OnGap; its
// error comes back as a stop.
func (s *session) gap(ctx context.Context, first, last uint64) error {
	cfg := &s.c.cfg
	g := Gap{Consumer: cfg.Durable, Stream: cfg.Stream, First: first, Last: last, Count: last - first + 1, After: s.pos}
	if err := cfg.OnGap(ctx, g); err != nil {
		return stop{errors.Wrapf(err, "natsconsumer: consumer %s: stream %s no longer holds messages %d to %d", cfg.Durable, cfg.Stream, first, last)}
	}
	return nil
}

// handle runs handle for d until it succeeds, pausing RetryBackoff after
// each failure (the events after it wait). A failure is logged at WARN the
// first time and then at most once a minute (at DEBUG between),
// with the attempts so far and how long it has been failing, and the
// success after failures at INFO: a database or a dependency down for an
// hour would otherwise log two WARNs a second. An error marked
// failure.Permanent is not retried: it is logged at ERROR and returned as a
// stop of its *HandlerError. It returns ctx's error when ctx ended first.
func (c *Consumer) handle(ctx context.Context, d delivery, handle func(context.Context, delivery) error) error {
	var failing ratelog.Run
	for {
		err := handle(ctx, d)
		if err == nil {
			if n, lasted, ok := failing.Recovered(); ok {
				c.cfg.Logger.InfoContext(ctx, "annals: handled a relayed event after failures",
					slog.String("consumer", c.cfg.Durable), slog.Int64("position", d.event.GlobalSequence),
					slog.Int("attempts", n+1), slog.Duration("failing_for", lasted.Round(time.Millisecond)))
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if failure.IsPermanent(err) {
			he := &HandlerError{Consumer: c.cfg.Durable, Stream: c.cfg.Stream, Sequence: d.seq, Position: d.event.GlobalSequence,
				EventID: d.event.ID, Type: d.event.Type, StreamID: d.event.StreamID, Err: err}
			c.cfg.Logger.ErrorContext(ctx, "annals: handling a relayed event failed permanently; stopping before it (the next run starts at it again)",
				slog.String("consumer", c.cfg.Durable), slog.String("stream", c.cfg.Stream), slog.Uint64("stream_seq", d.seq),
				slog.Int64("position", d.event.GlobalSequence), slog.String("event_id", d.event.ID.String()),
				slog.String("type", d.event.Type), slog.String("stream_id", d.event.StreamID), telemetry.Err(err))
			return stop{he}
		}
		level := failing.Failed()
		c.cfg.Logger.Log(ctx, level, "annals: handling a relayed event failed; retrying",
			slog.String("consumer", c.cfg.Durable), slog.Int64("position", d.event.GlobalSequence),
			slog.Int("attempts", failing.Count()), slog.Duration("failing_for", failing.For().Round(time.Millisecond)), telemetry.Err(err))
		if d.msg != nil {
			_ = d.msg.InProgress() // keep the server from re-delivering it meanwhile
		}
		if err := sleep(ctx, c.cfg.RetryBackoff); err != nil {
			return err
		}
	}
}

// requestTimeout bounds each JetStream request of a session (request):
// JetStream waits for an answer until the context's deadline when it has
// one, and applies a timeout of its own (5 s) only when it has none, so a
// consumer run with a deadline an hour away waited that long, in silence,
// for a server that was down.
const requestTimeout = 5 * time.Second

// request returns ctx bounded by requestTimeout for one JetStream request.
func request(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, requestTimeout)
}

// unreachable adds to err, when the consumer's NATS connection is not
// connected (the server down or restarting), a word saying so: the errors
// of JetStream requests made meanwhile ("context deadline exceeded") do
// not tell an outage from a slow server. A fetch in flight when the server
// stops ends with "server shutdown" while the connection may still read
// connected: it is said to be the start of an outage too.
func (c *Consumer) unreachable(err error) error {
	if st := c.js.Conn().Status(); st != nats.CONNECTED {
		return errors.Wrapf(err, "the NATS connection is %s (no NATS server answers)", st)
	}
	if errors.Is(err, jetstream.ErrServerShutdown) {
		return errors.Wrap(err, "the NATS server shut down (the connection reconnects to a server that answers)")
	}
	return err
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
