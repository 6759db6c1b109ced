package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/relay"
)

// relayProgress is what relay nats --status reports: how far the relay
// has published the log, what its stream holds, and how far each durable
// consumer of the stream (relay/natsconsumer's, or any other) has got.
type relayProgress struct {
	Relay string `json:"relay"`
	// Checkpoint is the relay's checkpoint (0: none yet), Head the log's
	// head, LagEvents the difference.
	Checkpoint int64 `json:"checkpoint"`
	Head       int64 `json:"head"`
	LagEvents  int64 `json:"lag_events"`
	// Stream is nil when the server has no stream by the name.
	Stream    *streamProgress    `json:"stream"`
	Consumers []consumerProgress `json:"consumers"`
}

type streamProgress struct {
	Name     string    `json:"name"`
	Created  time.Time `json:"created"`
	Messages uint64    `json:"messages"`
	FirstSeq uint64    `json:"first_seq"`
	LastSeq  uint64    `json:"last_seq"`
	// LastPosition is the log position of the newest message (its
	// Annals-Position header); nil when the stream is empty.
	LastPosition *int64 `json:"last_position"`
}

type consumerProgress struct {
	Name string `json:"name"`
	// AckFloorSeq is the stream sequence through which the consumer has
	// acknowledged every message; BehindMessages, the stream's messages
	// after it (last_seq - ack_floor_seq).
	AckFloorSeq    uint64 `json:"ack_floor_seq"`
	BehindMessages uint64 `json:"behind_messages"`
	// DeliveredSeq is the newest stream sequence delivered; AckPending,
	// the messages delivered and not acknowledged; Pending, those not
	// delivered yet; Redelivered, those delivered more than once and not
	// acknowledged.
	DeliveredSeq uint64 `json:"delivered_seq"`
	AckPending   int    `json:"ack_pending"`
	Pending      uint64 `json:"pending"`
	Redelivered  int    `json:"redelivered"`
	// Waiting is the pull requests waiting on the server: a consumer
	// process that runs and is caught up has one.
	Waiting int `json:"waiting"`
	// LastDelivery is when a message was last delivered (nil: never).
	LastDelivery *time.Time `json:"last_delivery"`
}

// loadRelayProgress reads the relay's checkpoint and the log's head from
// pool, and the stream and its consumers from js.
func loadRelayProgress(ctx context.Context, pool *pgxpool.Pool, q map[string]string, schema, name, stream string, js jetstream.JetStream) (*relayProgress, error) {
	p := &relayProgress{Relay: name, Consumers: []consumerProgress{}}
	var now time.Time
	if err := pool.QueryRow(ctx, q["Head"]).Scan(&p.Head, &now); err != nil {
		return nil, errors.Wrap(err, "read the head of the log")
	}
	cps, err := checkpoint.New(schema)
	if err != nil {
		return nil, err
	}
	cp, err := cps.Load(ctx, pool, name, 0)
	if err != nil && !errors.Is(err, checkpoint.ErrNotFound) {
		return nil, errors.Wrap(err, "relay: read the checkpoint")
	}
	p.Checkpoint = cp.Position
	p.LagEvents = max(p.Head-p.Checkpoint, 0)
	s, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return p, nil
	}
	if err != nil {
		return nil, errors.Wrapf(err, "relay: stream %s", stream)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, errors.Wrapf(err, "relay: stream %s", stream)
	}
	sp := &streamProgress{Name: stream, Created: info.Created.UTC(), Messages: info.State.Msgs,
		FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq}
	if info.State.Msgs > 0 {
		m, err := s.GetMsg(ctx, info.State.LastSeq)
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, errors.Wrapf(err, "relay: stream %s: read message %d", stream, info.State.LastSeq)
		}
		if err == nil {
			if pos, perr := strconv.ParseInt(m.Header.Get(relay.HeaderPosition), 10, 64); perr == nil {
				sp.LastPosition = &pos
			}
		}
	}
	p.Stream = sp
	list := s.ListConsumers(ctx)
	for ci := range list.Info() {
		c := consumerProgress{Name: ci.Name, AckFloorSeq: ci.AckFloor.Stream, DeliveredSeq: ci.Delivered.Stream,
			AckPending: ci.NumAckPending, Pending: ci.NumPending, Redelivered: ci.NumRedelivered, Waiting: ci.NumWaiting,
			LastDelivery: ci.Delivered.Last}
		if sp.LastSeq > c.AckFloorSeq {
			c.BehindMessages = sp.LastSeq - c.AckFloorSeq
		}
		p.Consumers = append(p.Consumers, c)
	}
	if err := list.Err(); err != nil {
		return nil, errors.Wrapf(err, "relay: stream %s: list its consumers", stream)
	}
	return p, nil
}

// write prints p as text: the relay, the stream, and a table of the
// consumers.
func (p *relayProgress) write(w io.Writer, now time.Time) error {
	if _, err := fmt.Fprintf(w, "relay %s: checkpoint %d, head of the log %d (%d behind)\n", p.Relay, p.Checkpoint, p.Head, p.LagEvents); err != nil {
		return err
	}
	s := p.Stream
	if s == nil {
		_, err := fmt.Fprintln(w, "stream: none by the name on the server (the relay makes it when it first runs)")
		return err
	}
	newest := "none (empty)"
	if s.LastPosition != nil {
		newest = strconv.FormatInt(*s.LastPosition, 10)
	}
	if _, err := fmt.Fprintf(w, "stream %s: %d messages (sequences %d to %d), newest at log position %s, made %s\n",
		s.Name, s.Messages, s.FirstSeq, s.LastSeq, newest, s.Created.Format("2006-01-02 15:04:05Z")); err != nil {
		return err
	}
	if len(p.Consumers) == 0 {
		_, err := fmt.Fprintln(w, "no durable consumers on the stream")
		return err
	}
	var t textTable
	t.add("CONSUMER", "ACKED THROUGH", "BEHIND", "DELIVERED", "UNACKED", "REDELIVERED", "WAITING", "LAST DELIVERY")
	for _, c := range p.Consumers {
		last := "never"
		if c.LastDelivery != nil {
			last = fmt.Sprintf("%s (%s ago)", c.LastDelivery.UTC().Format("2006-01-02 15:04:05Z"), now.Sub(*c.LastDelivery).Round(10*time.Millisecond))
		}
		t.add(textCell(c.Name), strconv.FormatUint(c.AckFloorSeq, 10), strconv.FormatUint(c.BehindMessages, 10),
			strconv.FormatUint(c.DeliveredSeq, 10), strconv.Itoa(c.AckPending), strconv.Itoa(c.Redelivered),
			strconv.Itoa(c.Waiting), last)
	}
	return t.write(w)
}

// relayStatus is relay nats --status (see relayProgress).
func (e *env) relayStatus(ctx context.Context, pool *pgxpool.Pool, nc *nats.Conn, name, stream, format string) error {
	q, err := e.queries()
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return errors.Wrap(err, "relay: JetStream")
	}
	p, err := loadRelayProgress(ctx, pool, q, e.schema, name, stream, js)
	if err != nil {
		return err
	}
	if format == outputJSON {
		return writeJSON(e.stdout, p)
	}
	return p.write(e.stdout, time.Now())
}
