package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
)

// Contender names, in table order.
const (
	annalsName    = "annals"
	rawName       = "raw"
	rawLockedName = "raw_locked"
	watermillName = "watermill"
)

// contenderNames lists every contender in table order.
var contenderNames = []string{annalsName, rawName, rawLockedName, watermillName}

// contenderTitles are the table's column headings.
var contenderTitles = map[string]string{
	annalsName:    "annals",
	rawName:       "raw INSERT, unordered",
	rawLockedName: "raw INSERT under a global lock",
	watermillName: "watermill-sql v4",
}

// eventType is the type every contender stores with each event.
const eventType = "bench.deposited"

// payload is every event's data: about 160 bytes of JSON, the same bytes for
// every contender.
var payload = json.RawMessage(`{"amount":1250,"currency":"EUR","note":"` + strings.Repeat("x", 120) + `"}`)

// wmTopic is watermill's topic; its tables live in the contender's schema.
const wmTopic = "bench"

// contender is one way of storing and reading events. Each works in a schema
// of its own, which reset drops and recreates empty.
type contender struct {
	name   string
	schema string
	pool   *pgxpool.Pool
	// store is annals' event store (annals only).
	store *eventstore.Store
	// pub is watermill's publisher (watermill only).
	pub *wmsql.Publisher
}

// newContender returns the contender called name working in schema
// prefix+"_"+name.
func newContender(pool *pgxpool.Pool, prefix, name string) (*contender, error) {
	c := &contender{name: name, schema: prefix + "_" + name, pool: pool}
	switch name {
	case annalsName:
		// The default configuration, apart from the schema.
		store, err := eventstore.New(pool, &eventstore.Config{Schema: c.schema})
		if err != nil {
			return nil, err
		}
		c.store = store
	case rawName, rawLockedName:
	case watermillName:
		pub, err := wmsql.NewPublisher(wmsql.BeginnerFromPgx(pool), wmsql.PublisherConfig{SchemaAdapter: c.wmSchema()}, watermill.NopLogger{})
		if err != nil {
			return nil, errors.Wrap(err, "watermill publisher")
		}
		c.pub = pub
	default:
		return nil, errors.Newf("unknown contender %q (want one of %s)", name, strings.Join(contenderNames, ", "))
	}
	return c, nil
}

// wmSchema is watermill's PostgreSQL schema adapter with its tables in the
// contender's schema; everything else is the default.
func (c *contender) wmSchema() wmsql.DefaultPostgreSQLSchema {
	return wmsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string {
			return pgx.Identifier{c.schema, "watermill_" + topic}.Sanitize()
		},
	}
}

// wmOffsets is watermill's default PostgreSQL offsets adapter with its table
// in the contender's schema.
func (c *contender) wmOffsets() wmsql.DefaultPostgreSQLOffsetsAdapter {
	return wmsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string {
			return pgx.Identifier{c.schema, "watermill_offsets_" + topic}.Sanitize()
		},
	}
}

// wmSubscriber returns a watermill subscriber with the default settings,
// apart from the poll interval when poll is not zero.
func (c *contender) wmSubscriber(group string, poll time.Duration) (*wmsql.Subscriber, error) {
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(c.pool), wmsql.SubscriberConfig{
		ConsumerGroup:  group,
		PollInterval:   poll,
		SchemaAdapter:  c.wmSchema(),
		OffsetsAdapter: c.wmOffsets(),
	}, watermill.NopLogger{})
	return sub, errors.Wrap(err, "watermill subscriber")
}

// reset drops the contender's schema and creates it again, empty.
func (c *contender) reset(ctx context.Context) error {
	if err := c.drop(ctx); err != nil {
		return err
	}
	if _, err := c.pool.Exec(ctx, query("CreateSchema", c.schema)); err != nil {
		return errors.Wrapf(err, "%s: create schema", c.name)
	}
	switch c.name {
	case annalsName:
		_, err := migrations.Up(ctx, c.pool, &migrations.Config{Schema: c.schema})
		return errors.Wrapf(err, "%s: migrate", c.name)
	case rawName, rawLockedName:
		_, err := c.pool.Exec(ctx, query("RawSetup", c.schema))
		return errors.Wrapf(err, "%s: create the table", c.name)
	case watermillName:
		sub, err := c.wmSubscriber("setup", 0)
		if err != nil {
			return err
		}
		defer sub.Close()
		return errors.Wrapf(sub.SubscribeInitialize(wmTopic), "%s: create the tables", c.name)
	}
	return nil
}

// drop removes the contender's schema.
func (c *contender) drop(ctx context.Context) error {
	_, err := c.pool.Exec(ctx, query("DropSchema", c.schema))
	return errors.Wrapf(err, "%s: drop schema", c.name)
}

// globalLock is the advisory lock of the locked raw contender.
var globalLock = [2]int32{0x70656572, 1}

// append stores the events ids (one payload each) at the end of stream,
// whose current version is version, in one transaction.
func (c *contender) append(ctx context.Context, stream string, version int64, ids []uuid.UUID) error {
	switch c.name {
	case annalsName:
		events := make([]eventstore.EventData, len(ids))
		for i, id := range ids {
			events[i] = eventstore.EventData{ID: id, Type: eventType, Data: payload}
		}
		_, err := c.store.Append(ctx, stream, eventstore.Exact(version), events...)
		return err
	case rawName, rawLockedName:
		batch := &pgx.Batch{}
		if c.name == rawLockedName {
			batch.Queue(query("GlobalLock", c.schema), globalLock[0], globalLock[1])
		}
		if len(ids) == 1 {
			batch.Queue(query("RawInsertOne", c.schema), ids[0], stream, version+1, eventType, payload)
		} else {
			data := make([]string, len(ids))
			for i := range data {
				data[i] = string(payload)
			}
			batch.Queue(query("RawInsertMany", c.schema), ids, stream, version, eventType, data)
		}
		// A batch without BEGIN is one implicit transaction, sent in one
		// round trip.
		return c.pool.SendBatch(ctx, batch).Close()
	case watermillName:
		msgs := make([]*message.Message, len(ids))
		for i, id := range ids {
			msgs[i] = message.NewMessage(id.String(), message.Payload(payload))
			msgs[i].SetContext(ctx)
		}
		return c.pub.Publish(wmTopic, msgs...)
	}
	return errors.Newf("unknown contender %q", c.name)
}

// tail follows the log from its start until ctx ends, calling seen for
// every event it is given, in the order given. Position readers poll every
// poll when they find nothing new.
func (c *contender) tail(ctx context.Context, poll time.Duration, seen func(uuid.UUID)) error {
	switch c.name {
	case annalsName:
		next := int64(1)
		for {
			got := 0
			for e, err := range c.store.ReadAll(ctx, next) {
				if err != nil {
					return ignoreDone(ctx, err)
				}
				seen(e.ID)
				next = e.GlobalSequence + 1
				got++
			}
			if got == 0 && !sleep(ctx, poll) {
				return nil
			}
		}
	case rawName, rawLockedName:
		var after int64
		q := query("RawTail", c.schema)
		for {
			rows, err := c.pool.Query(ctx, q, after, 500)
			if err != nil {
				return ignoreDone(ctx, err)
			}
			var pos int64
			var id uuid.UUID
			got := 0
			_, err = pgx.ForEachRow(rows, []any{&pos, &id}, func() error {
				seen(id)
				after = pos
				got++
				return nil
			})
			if err != nil {
				return ignoreDone(ctx, err)
			}
			if got == 0 && !sleep(ctx, poll) {
				return nil
			}
		}
	case watermillName:
		sub, err := c.wmSubscriber("tail", poll)
		if err != nil {
			return err
		}
		defer sub.Close()
		msgs, err := sub.Subscribe(ctx, wmTopic)
		if err != nil {
			return errors.Wrap(err, "watermill subscribe")
		}
		for {
			select {
			case <-ctx.Done():
				return nil
			case m, ok := <-msgs:
				if !ok {
					return nil
				}
				id, err := uuid.Parse(m.UUID)
				if err != nil {
					return errors.Wrap(err, "watermill message UUID")
				}
				seen(id)
				m.Ack()
			}
		}
	}
	return errors.Newf("unknown contender %q", c.name)
}

// readAll reads the whole log (of want events) from its start with a no-op
// consumer, giving up after limit, and returns the number of events read.
// round names the consumer so that every round starts from zero.
func (c *contender) readAll(ctx context.Context, round, want int, limit time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	switch c.name {
	case annalsName:
		// The projection runner with its defaults and a no-op projection.
		r, err := projection.NewRunner(c.pool, &projection.Config{
			Schema: c.schema,
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			return 0, err
		}
		p := &noopProjection{name: "peers-catchup-" + itoa(round)}
		if err := r.Register(p, nil); err != nil {
			return 0, err
		}
		err = r.RunUntilCaughtUp(ctx)
		return int(p.n.Load()), ignoreDone(ctx, err)
	case rawName, rawLockedName:
		// A hand-written paged reader that scans payloads into []byte.
		q := query("RawRead", c.schema)
		var (
			after, pos, version int64
			id                  uuid.UUID
			stream, typ         string
			data, meta          []byte
			at                  time.Time
		)
		n := 0
		for {
			rows, err := c.pool.Query(ctx, q, after, 500)
			if err != nil {
				return n, ignoreDone(ctx, err)
			}
			got := 0
			_, err = pgx.ForEachRow(rows, []any{&pos, &id, &stream, &version, &typ, &data, &meta, &at}, func() error {
				after = pos
				got++
				return nil
			})
			if err != nil {
				return n, ignoreDone(ctx, err)
			}
			n += got
			if got < 500 {
				return n, nil
			}
		}
	case watermillName:
		// A subscriber with watermill's defaults, acking every message.
		sub, err := c.wmSubscriber("catchup-"+itoa(round), 0)
		if err != nil {
			return 0, err
		}
		defer sub.Close()
		msgs, err := sub.Subscribe(ctx, wmTopic)
		if err != nil {
			return 0, errors.Wrap(err, "watermill subscribe")
		}
		n := 0
		for n < want {
			select {
			case <-ctx.Done():
				return n, nil
			case m, ok := <-msgs:
				if !ok {
					return n, nil
				}
				m.Ack()
				n++
			}
		}
		return n, nil
	}
	return 0, errors.Newf("unknown contender %q", c.name)
}

// noopProjection counts the events it is given and does nothing else.
type noopProjection struct {
	name string
	n    atomic.Int64
}

func (p *noopProjection) Name() string { return p.name }

func (p *noopProjection) Handle(context.Context, pgx.Tx, eventstore.Event) error {
	p.n.Add(1)
	return nil
}

// ignoreDone returns nil for an error caused by ctx ending.
func ignoreDone(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return nil
	}
	return err
}

// sleep waits for d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
