package relay

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/telemetry"
	"github.com/annals-dev/annals/migrations"
)

// ErrPublish is matched by the error that ends a leadership after a publish
// failed or went unacknowledged: the relay stands by and claims again, from
// its checkpoint, which never passed an unacknowledged event.
var ErrPublish = errors.New("relay: publish failed")

// ErrNotPermitted is matched by the failure of a publish that went
// unacknowledged because the NATS user may not make it: publish to the
// relay's subjects, or subscribe to the inbox JetStream acknowledges on.
// The server drops such a message without an answer and tells the
// connection only (a -ERR, which nats.go keeps as the connection's last
// error), so the relay learns it when AckTimeout passes and that error
// names one of its subjects or the inbox. Each leadership is refused the
// same way until the user's permissions are changed. CatchUp's error, and
// the log's, carry it.
var ErrNotPermitted = errors.New("relay: NATS does not permit the relay's user to publish the events")

// publisher is the relay's catchup.Processor. It publishes each batch
// pipelined and does not wait for the batch's acknowledgements before
// returning: it waits for them while the next batch is published (the
// chain of expected last message IDs keeps the order), and when the
// subscription goes idle or ends. The checkpoint commits (fenced by the
// epoch) only through acknowledged events: after every CheckpointInterval,
// when idle, and at the end.
type publisher struct {
	r      *Relay
	stream jetstream.Stream
	origin string // HeaderOrigin

	// What the stream is known to hold (position and message ID of its
	// newest message), read at the start of each leadership.
	synced  bool
	lastPos int64
	lastID  string
	// lastSeq is the stream's last sequence then: what the first message
	// into an empty stream expects (message).
	lastSeq uint64
	// created is the stream's creation time (Unix nanoseconds), and ackSeq
	// the stream sequence of the last message acknowledged (the stream's
	// last sequence at the start until one is): what each checkpoint
	// commit records (RecordAcked), for the next leaderships to tell a
	// stream that lost acknowledged messages (behind).
	created int64
	ackSeq  uint64
	// refillTo is where a refill of what the stream lost ends: the
	// checkpoint the leadership that moved back found (behind), kept in
	// relay_acks for the leaderships that go on with it; 0 when none is
	// under way. refillSeq is the stream sequence the stream had
	// acknowledged before it lost its tail (kept with refillTo): the
	// messages still to publish again are refillSeq less the stream's last
	// sequence. An event at or below refillTo that NATS refuses for good
	// (refusedForGood) is passed over again, not waited on, while the
	// events left outnumber those messages (mayPassOver).
	refillTo  int64
	refillSeq uint64
	// maxMsgSize and fileStore are the stream's limits as the leadership
	// found them (stored): what refusal checks before a refill publishes.
	maxMsgSize int32
	fileStore  bool

	// prevID is the ID of the last event published (acknowledged or not).
	prevID string
	// inflight are published, unacknowledged messages in position order;
	// through is the position the published batches cover (their Through).
	inflight []sent
	through  int64
	// acked is the position through which everything is acknowledged (and
	// covered); committed is the checkpoint's position, at lastCommit.
	acked, committed int64
	lastCommit       time.Time
}

type sent struct {
	pos     int64
	id      string
	msg     *nats.Msg // as published, for rechain
	f       jetstream.PubAckFuture
	through int64 // the covering Through when this is a batch's last message
}

func (p *publisher) Start(ctx context.Context, lease *catchup.Lease) error {
	st, err := p.r.lastStored(ctx, p.stream)
	if err != nil && !errors.Is(err, ErrStreamMismatch) {
		// The stream may be gone (deleted, or the server's store lost),
		// or this handle stale: look it up again by name, and make it
		// again if it is not there, or the relay would stand by and fail
		// here for ever. What a lost stream held is not published again
		// by itself (EnsureStream logs how).
		s, eerr := p.r.EnsureStream(ctx)
		if eerr != nil {
			p.r.failed(eerr)
			return eerr
		}
		// Made again, EnsureStream has said so.
		p.stream = s
		st, err = p.r.lastStored(ctx, p.stream)
	}
	if err != nil {
		p.r.failed(err)
		return err
	}
	origin, err := p.r.loadOrigin(ctx)
	if err != nil {
		p.r.failed(err)
		return err
	}
	*p = publisher{r: p.r, stream: p.stream, origin: origin}
	if err := p.behind(ctx, lease, st); err != nil {
		p.r.failed(err)
		return err
	}
	// What the stream holds through its newest message (pos) counts as
	// acknowledged as Process skips it (not here: the engine relies on
	// every commit being at or below a position Process has returned).
	p.synced, p.lastPos, p.lastID, p.prevID, p.lastSeq = true, st.pos, st.id, st.id, st.seq
	p.created, p.ackSeq = st.created.UnixNano(), st.seq
	p.maxMsgSize, p.fileStore = st.maxMsgSize, st.fileStore
	p.through, p.acked, p.committed, p.lastCommit = lease.Start, lease.Start, lease.Start, time.Now()
	if p.r.onStarted != nil {
		p.r.onStarted()
	}
	return nil
}

// behind looks at the stream as the leadership found it (st) against what
// the relay recorded with its last checkpoint commit (acks), and says, or
// mends, what the stream lacks below the checkpoint.
//
// A stream whose newest message is below the checkpoint is normal: a relay
// of some types moves its checkpoint past the events of others, and an
// operator moves it past an event NATS refuses (over max_payload, a stream
// limit, a permission). It is a loss only when the stream no longer holds
// messages it acknowledged: JetStream acknowledges a message before it
// writes it to disk, so a crash of the server's machine loses the newest,
// and so does a store restored from a backup. The stream tells (acks.lost):
// its last sequence is below the one the relay recorded with its
// checkpoint (RecordAcked), and it is the same stream (name and creation
// time). Then the relay publishes the lost messages again: it moves its
// checkpoint back to the stream's newest message, fenced by the lease's
// epoch and only from where the leadership found it, and starts the
// leadership there (lease.Start, from which the engine reads once Start
// returns), chained on that message, so each lands once, in order; an
// event NATS refuses for good up to where it found the checkpoint is passed
// over (refillTo, recorded with the move back for the leaderships that go
// on with the refill, with the sequence the stream had acknowledged,
// refillSeq) while the events left outnumber the messages the stream lost
// (mayPassOver): the surplus is what an operator had moved past. A leader
// that dies on the way
// leaves the checkpoint at or below what the stream holds, as any leader
// does. A relay with nothing recorded (the first run of a version that
// records) does not move back.
//
// A stream that lost what it acknowledged and holds nothing now (the rest
// removed since by MaxAge or a purge, or its store restored from before
// the relay's first publish into it) keeps its last sequence, but no
// message tells which event was at it: relay_acks records one pair of
// sequence and position, at the last commit, and the events between the
// two were published at sequences the relay did not record. Moved back to
// a guess, the relay would publish again events the stream had delivered
// (a position too low) or leave out some it lost (too high), silently
// either way, which its exactly-once promise rules out; recording the
// position of every message acknowledged (so far back as a backup may be
// old) would add a write per event to every commit for a rare case. So the
// relay logs an ERROR naming the lost sequences and how to publish them
// (a stream made anew from position 0, warnBehind's advice), once per
// stream and loss in a process, and publishes from its checkpoint on.
//
// A stream of the recorded name made since at another time (deleted and
// made again by an operator, or by a server that lost its store) holds
// none of the events up to the checkpoint: the relay publishes from its
// checkpoint on and says so (warnBehind), once per stream, as when it makes
// the stream itself (EnsureStream); so for an empty stream that never held
// a message (made by hand) with nothing recorded of it.
func (p *publisher) behind(ctx context.Context, lease *catchup.Lease, st stored) error {
	acks, err := p.loadAcks(ctx, lease)
	if err != nil {
		return err
	}
	if acks.same(p.r.cfg.Stream, st) {
		p.refillTo, p.refillSeq = acks.refillTo, uint64(acks.refillSeq) // a refill under way goes on
	}
	if st.pos >= lease.Start {
		return nil
	}
	created := st.created.UnixNano()
	lost := acks.lost(p.r.cfg.Stream, st)
	switch {
	case lost > 0 && st.pos == 0:
		p.r.errorLostEmpty(ctx, st, acks, lease.Start)
		return nil
	case lost > 0:
		// Moved back below.
	case acks.ok && acks.stream == p.r.cfg.Stream && acks.created != created:
		if p.r.warnedStream.Load() != created {
			p.r.warnBehind(ctx, fmt.Sprintf("the relay's JetStream stream %s was made again (deleted and made by an operator, or by a server that lost its store): "+
				"it was made at %s, not at %s as when the relay last committed its checkpoint",
				p.r.cfg.Stream, st.created.UTC().Format(time.RFC3339Nano), time.Unix(0, acks.created).UTC().Format(time.RFC3339Nano)), lease.Start, st.created)
		}
		return nil
	case st.pos == 0 && st.seq == 0:
		if p.r.warnedStream.Load() != created {
			p.r.warnBehind(ctx, fmt.Sprintf("the relay's JetStream stream %s is empty and has never held a message "+
				"(made by hand, or its store restored from before the relay's first publish)", p.r.cfg.Stream), lease.Start, st.created)
		}
		return nil
	default:
		return nil
	}
	q, err := p.r.queries()
	if err != nil {
		return err
	}
	if err := lease.Do(ctx, func(conn *pgx.Conn) error {
		return pgx.BeginTxFunc(ctx, conn, p.r.txOptions(), func(tx pgx.Tx) error {
			var pos int64
			err := tx.QueryRow(ctx, q["MoveBack"], lease.Subscriber, lease.Partition, lease.Epoch, st.pos, lease.Start).Scan(&pos)
			if errors.Is(err, pgx.ErrNoRows) {
				return errors.Wrapf(checkpoint.ErrFenced, "relay: move the checkpoint of %s back to %d at epoch %d", lease.Subscriber, st.pos, lease.Epoch)
			}
			if err != nil {
				return errors.Wrapf(err, "relay: move the checkpoint back to %d", st.pos)
			}
			_, err = tx.Exec(ctx, q["RecordRefill"], lease.Subscriber, lease.Partition, lease.Start, int64(lost))
			return errors.Wrapf(notMigrated(err), "relay: record the refill up to %d", lease.Start)
		})
	}); err != nil {
		return err
	}
	p.r.cfg.Logger.ErrorContext(ctx, fmt.Sprintf("annals: the relay's JetStream stream %s lost messages it had acknowledged: its last sequence is %d "+
		"(its newest message is event %d), but it had acknowledged through sequence %d when the relay last committed its checkpoint, now at %d. "+
		"JetStream acknowledges a message before it writes it to disk (sync_interval, 2 minutes by default), so the server's machine crashed, "+
		"or its store was restored from a backup. "+
		"The relay moved its checkpoint back to %d and publishes the lost events again, each once, in order. "+
		"To keep what JetStream acknowledges: sync_interval: always in the server's jetstream block, or a stream of 3 replicas",
		p.r.cfg.Stream, st.seq, st.pos, lost, lease.Start, st.pos),
		slog.String("relay", p.r.cfg.Name), slog.String("stream", p.r.cfg.Stream),
		slog.Uint64("stream_sequence", st.seq), slog.Uint64("acknowledged_sequence", lost),
		slog.Int64("stream_position", st.pos), slog.Int64("checkpoint", lease.Start))
	p.refillTo, p.refillSeq = max(p.refillTo, lease.Start), max(p.refillSeq, lost)
	lease.Start = st.pos
	return nil
}

// acks is what the relay recorded with its last checkpoint commit
// (RecordAcked, LoadAcked).
type acks struct {
	ok       bool   // a row was found
	stream   string // the stream's name
	created  int64  // its creation time (Unix nanoseconds)
	seq      int64  // the stream sequence acknowledged through the checkpoint
	pos      int64  // that checkpoint
	refillTo int64  // where a refill under way ends (RecordRefill); 0: none
	// the stream sequence acknowledged before the loss the refill mends
	refillSeq int64
}

// loadAcks reads what the relay recorded with its last checkpoint commit;
// ok is false when nothing is recorded.
func (p *publisher) loadAcks(ctx context.Context, lease *catchup.Lease) (acks, error) {
	q, err := p.r.queries()
	if err != nil {
		return acks{}, err
	}
	a := acks{ok: true}
	err = p.r.pool.QueryRow(ctx, q["LoadAcked"], lease.Subscriber, lease.Partition).Scan(&a.stream, &a.created, &a.seq, &a.pos, &a.refillTo, &a.refillSeq)
	if errors.Is(err, pgx.ErrNoRows) {
		return acks{}, nil
	}
	if err != nil {
		return acks{}, errors.Wrap(notMigrated(err), "relay: read the stream sequence acknowledged at the checkpoint")
	}
	return a, nil
}

// notMigrated marks with migrations.ErrNotMigrated, and says to migrate, an
// error of a relay_acks query on a schema migrated only through 0036 (a new
// binary deployed before `annals migrate`): the column it names is not
// there yet (SQLSTATE 42703, undefined_column). Only the relay's queries
// are marked so: a 42703 elsewhere may be another fault than an old schema.
func notMigrated(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42703" {
		return err
	}
	return errmark.Mark(errors.Wrap(err, "the annals schema is older than this relay (relay_acks gained refill_to and refill_seq in migration 0037, rewinds in 0043): "+
		"run 'annals migrate'"), migrations.ErrNotMigrated)
}

// same reports whether st is the stream recorded: name and creation time.
func (a acks) same(stream string, st stored) bool {
	return a.ok && a.stream == stream && a.created == st.created.UnixNano()
}

// lost returns the stream sequence recorded as acknowledged when st is the
// stream recorded (same) and its last sequence is below that: the stream
// lost acknowledged messages. 0 otherwise, and when nothing is recorded. A
// purge keeps the stream's last sequence, and so does not count; nor do
// the relay's types changed, or its checkpoint moved forward by an
// operator: the stream holds what it acknowledged.
func (a acks) lost(stream string, st stored) uint64 {
	if !a.same(stream, st) || a.seq <= 0 || st.seq >= uint64(a.seq) {
		return 0
	}
	return uint64(a.seq)
}

// message returns the message of event e and the options to publish it
// with, chained on the message prev (when the stream is empty: prev "" and
// the stream's last sequence seq).
//
// Each message carries Nats-Msg-Id (the event ID) and
// Nats-Expected-Last-Msg-Id (the ID of the event published before it):
// JetStream stores a message only right after its predecessor, so the
// stream always holds a prefix of the relay's sequence, in position order,
// whatever is lost or re-sent; a message already stored is dropped as a
// duplicate before that check. The first message into an empty stream
// expects the stream's last sequence as the leadership's start read it
// (Nats-Expected-Last-Sequence), so that of two publishers into an empty
// stream (relays of two logs on a stream made beforehand, without the
// relay's metadata) only one gets in.
func (p *publisher) message(e eventstore.Event, prev string, seq uint64) (*nats.Msg, []jetstream.PublishOpt, error) {
	msg, err := Message(p.r.cfg.Name, p.r.subj.render(e), e)
	if err != nil {
		return nil, nil, err
	}
	msg.Header.Set(HeaderOrigin, p.origin)
	return msg, p.chain(e.ID.String(), prev, seq), nil
}

// chain returns the options that publish the message of event id chained
// on the message prev (when the stream is empty: prev "" and its last
// sequence seq); see message.
func (p *publisher) chain(id, prev string, seq uint64) []jetstream.PublishOpt {
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(id), jetstream.WithExpectStream(p.r.cfg.Stream)}
	if prev != "" {
		return append(opts, jetstream.WithExpectLastMsgID(prev))
	}
	return append(opts, jetstream.WithExpectLastSequence(seq))
}

// rechain publishes again, in order, the messages in flight from the
// index from on, chained on the stream's newest message (lastID) instead
// of the event passed over before them, which the stream refused: each
// expects its predecessor as the stream's newest message, so JetStream
// refuses them all (the messages arrive in order on the one connection:
// the first sent are refused before the second are stored, and a stream of
// one replica does not record a refused message for de-duplication).
// Their acknowledgements are the second sending's. A replicated stream
// records a message's ID before it checks the chain, and refuses the
// second sending ("duplicate message id is in process", 10158) until its
// leader changes or the duplicate window passes: the leadership ends, as
// after any failed publish, committing through the event passed over, and
// the next ones claim again until then. So Process checks the limits
// before it sends (refusal), and this is the fallback for a refusal it did
// not foresee (a limit lowered within the leadership, the account's).
func (p *publisher) rechain(from int) error {
	prev := p.lastID
	for i := from; i < len(p.inflight); i++ {
		s := &p.inflight[i]
		msg := &nats.Msg{Subject: s.msg.Subject, Header: maps.Clone(s.msg.Header), Data: s.msg.Data}
		msg.Header.Del(jetstream.ExpectedLastMsgIDHeader)
		msg.Header.Del(jetstream.ExpectedLastSeqHeader)
		f, err := p.r.js.PublishMsgAsync(msg, p.chain(s.id, prev, p.lastSeq)...)
		if err != nil {
			return errors.Wrapf(err, "relay: publish event %d again", s.pos)
		}
		s.msg, s.f = msg, f
		prev = s.id
	}
	p.prevID = prev
	return nil
}

// Process publishes the batch's events (those the stream does not hold
// yet), chained (message), then collects the acknowledgements that have
// come in, waiting only for those of earlier batches, and commits the
// checkpoint when due.
func (p *publisher) Process(ctx context.Context, lease *catchup.Lease, batch catchup.Batch) (int64, error) {
	earlier := len(p.inflight)
	for _, e := range batch.Events {
		if e.GlobalSequence <= p.lastPos {
			// Stored already (a takeover after an uncommitted checkpoint):
			// acknowledged, though not by this leadership. Counted here, so
			// the checkpoint moves past it even when the next publish fails
			// (nothing else would: an event that cannot be published right
			// after it would keep the checkpoint behind it for ever).
			if len(p.inflight) == 0 {
				p.acked = max(p.acked, e.GlobalSequence)
			}
			continue
		}
		msg, opts, err := p.message(e, p.prevID, p.lastSeq)
		if err != nil {
			return batch.After, p.fail(ctx, lease, err)
		}
		var f jetstream.PubAckFuture
		// Checked before sending only in a refill, where a refused event
		// may be passed over; elsewhere the server's answer tells.
		var refused error
		if e.GlobalSequence <= p.refillTo {
			refused = p.refusal(msg, e.ID.String(), p.prevID, p.lastSeq)
		}
		if refused == nil {
			f, err = p.r.js.PublishMsgAsync(msg, opts...)
		}
		if refused == nil && err != nil && refusedForGood(err) {
			refused = err // the client's own check (max_payload)
		}
		if refused != nil && e.GlobalSequence <= p.refillTo {
			// Published again after the stream lost it, below where the
			// checkpoint was, and NATS would refuse it for good: found
			// before sending, so that no message is chained on it (the
			// successors of a refused message get "in process" refusals
			// on a replicated stream). Passed over, as acknowledged (as an
			// event that does not match), if an operator had moved past
			// it (passOverInRefill); else the refill stops.
			if err := p.collect(ctx, lease, len(p.inflight), true); err != nil {
				return batch.After, p.fail(ctx, lease, err)
			}
			earlier = 0 // all collected
			if err := p.passOverInRefill(ctx, e.GlobalSequence, refused); err != nil {
				return batch.After, p.fail(ctx, lease, errors.Wrapf(err, "relay: publish event %d", e.GlobalSequence))
			}
			if len(p.inflight) == 0 {
				p.acked = max(p.acked, e.GlobalSequence)
			}
			continue
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			// Retrying cannot help, and every later event waits behind
			// this one: say what the operator can do.
			err = errors.Wrapf(err, "event %d has %d bytes of data, and with its metadata and the relay's headers it is over the NATS server's max_payload (%d bytes); "+
				"raise max_payload on the server, or move the relay past the event (%s); every later event waits behind it",
				e.GlobalSequence, len(e.Data), p.r.js.Conn().MaxPayload(), p.r.checkpointSetHint(e.GlobalSequence))
		}
		if err != nil {
			return batch.After, p.fail(ctx, lease, errors.Wrapf(err, "relay: publish event %d", e.GlobalSequence))
		}
		p.inflight = append(p.inflight, sent{pos: e.GlobalSequence, id: e.ID.String(), msg: msg, f: f})
		p.prevID = e.ID.String()
	}
	// Once the last message in flight is acknowledged, everything through
	// this batch is (the batch's unpublished events are stored already or
	// did not match).
	if len(p.inflight) > 0 {
		p.inflight[len(p.inflight)-1].through = batch.Through
	}
	p.through = batch.Through
	if len(p.inflight) == 0 {
		p.acked = max(p.acked, batch.Through) // nothing to publish or wait for
	}
	// Wait for the earlier batches' acknowledgements; take this batch's
	// that are in.
	if err := p.collect(ctx, lease, earlier, true); err != nil {
		return batch.Through, p.fail(ctx, lease, err)
	}
	if err := p.collect(ctx, lease, len(p.inflight), false); err != nil {
		return batch.Through, p.fail(ctx, lease, err)
	}
	if time.Since(p.lastCommit) >= p.r.cfg.CheckpointInterval {
		if err := p.commit(ctx, lease); err != nil {
			return batch.Through, err
		}
	}
	return batch.Through, nil
}

// collect takes the acknowledgements of the first n in-flight messages, in
// order: waiting for each (up to AckTimeout in all; await) when wait is
// set, else only those already in.
func (p *publisher) collect(ctx context.Context, lease *catchup.Lease, n int, wait bool) error {
	var timeout <-chan time.Time
	if wait {
		t := time.NewTimer(p.r.cfg.AckTimeout)
		defer t.Stop()
		timeout = t.C
	}
	done := 0
	for ; done < n; done++ {
		s := p.inflight[done]
		var (
			ack *jetstream.PubAck
			err error
		)
		if wait {
			ack, err = p.await(ctx, lease, s, timeout)
		} else {
			select {
			case ack = <-s.f.Ok():
			case err = <-s.f.Err():
				if errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
					err = p.unanswered(err)
				}
			default:
				p.inflight = p.inflight[done:]
				return nil
			}
		}
		if err != nil && s.pos <= p.refillTo && refusedForGood(err) {
			// The stream refuses, for good, an event of the refill that
			// Process's check (refusal) did not foresee: passed over as
			// there, if an operator had moved past it. Every message
			// before it is acknowledged (ackSeq is the stream's last
			// sequence), and those after it are refused (chained on it).
			if perr := p.passOverInRefill(ctx, s.pos, err); perr != nil {
				p.inflight = p.inflight[done:]
				return errors.Wrapf(perr, "relay: publish event %d", s.pos)
			}
			p.acked = s.pos
			if s.through > 0 {
				p.acked = s.through
			}
			if err := p.rechain(done + 1); err != nil {
				p.inflight = p.inflight[done+1:]
				return err
			}
			continue
		}
		if err != nil {
			p.inflight = p.inflight[done:]
			if refusedForGood(err) {
				err = errors.Wrapf(err, "the stream refuses event %d for its size, and will at every try (%s); "+
					"raise the limit, or move the relay past the event (%s); every later event waits behind it",
					s.pos, refusalLimit(err), p.r.checkpointSetHint(s.pos))
			}
			return errors.Wrapf(err, "relay: publish event %d", s.pos)
		}
		p.lastPos, p.lastID = s.pos, s.id
		p.acked = s.pos
		if ack != nil {
			p.ackSeq = max(p.ackSeq, ack.Sequence)
		}
		if s.through > 0 {
			p.acked = s.through
		}
	}
	p.inflight = p.inflight[done:]
	if len(p.inflight) == 0 {
		p.acked = max(p.acked, p.through)
	}
	return nil
}

// passOverInRefill decides on the event at pos, at or below refillTo, that
// NATS refuses for good (cause), once every message before it is
// acknowledged: it returns nil, having logged a WARN, when the event may be
// passed over, and the error that stops the refill otherwise (stopRefill).
//
// That NATS refuses it now does not tell that it refused it when the relay
// first published it, and so that an operator moved the relay past it: a
// limit may have been lowered since the stream stored it (max_msg_size
// lowered by an operator, max_payload by a server's configuration), and
// passing over an event the stream had acknowledged, and maybe delivered,
// would leave it out of the stream silently. What tells is a count. The
// stream had acknowledged through sequence refillSeq before it lost its
// tail, and holds through ackSeq now: refillSeq-ackSeq messages it lost
// are still to publish again, each one event of (pos, refillTo] (one relay
// per stream: every message of it is one of the relay's events, in
// position order). The events of (pos, refillTo] the relay publishes
// (CountRefill) are those and the events an operator moved the relay past,
// which the stream never held: the surplus counts these. The event is
// passed over only while there is a surplus; with none, it is one the
// stream had stored, and the refill stops until the limit is raised.
//
// The count tells how many of the events left an operator moved past, not
// which: a refill that meets both an event the stream had stored, refused
// under a lowered limit, and an operator's skip after it passes over the
// first and stops at the second, where the surplus is spent (the ERROR
// then names it, and the WARN before names the event passed over). The
// count also takes the relay's types as they are now: events of types
// added since count in the surplus (they were never published), events of
// types removed do not (the refill then stops rather than pass over).
func (p *publisher) passOverInRefill(ctx context.Context, pos int64, cause error) error {
	q, err := p.r.queries()
	if err != nil {
		return err
	}
	var left int64
	if err := p.r.pool.QueryRow(ctx, q["CountRefill"], pos, p.refillTo, p.r.filter.Regex()).Scan(&left); err != nil {
		return errors.Wrapf(err, "relay: count the events left to publish again from %d through %d", pos, p.refillTo)
	}
	var lost int64
	if p.refillSeq > p.ackSeq {
		lost = int64(p.refillSeq - p.ackSeq)
	}
	if left <= lost {
		return p.stopRefill(ctx, pos, cause, left, lost)
	}
	p.r.cfg.Logger.WarnContext(ctx, fmt.Sprintf("annals: the relay passes over an event NATS refuses for good, publishing again what the stream lost: "+
		"the %d events left through %d outnumber the %d messages the stream lost still to publish, by the events an operator had moved the relay past "+
		"(refused then, as this one is now)", left, p.refillTo, lost),
		slog.String("relay", p.r.cfg.Name), slog.Int64("position", pos), slog.Int64("checkpoint_was", p.refillTo),
		slog.Int64("events_left", left), slog.Int64("lost_left", lost), telemetry.Err(cause))
	return nil
}

// stopRefill returns the error that stops a refill at the event at pos,
// which NATS refuses for good (cause) though the stream had stored it
// (passOverInRefill), and logs it at ERROR once per event in a process
// (toldRefused): every leadership stops there until a limit is raised.
func (p *publisher) stopRefill(ctx context.Context, pos int64, cause error, left, lost int64) error {
	err := errors.Wrapf(cause, "the relay publishes again what its JetStream stream %s lost, and the stream refuses event %d (%s), which it had stored: "+
		"the %d events left through %d do not outnumber the %d messages the stream lost still to publish, so no operator moved the relay past this one, "+
		"and a limit was lowered since the stream stored it. Raise the limit: the relay then publishes it again, and the events after it. "+
		"Moving the relay past it (%s) leaves it out of the stream for good, and the refill can then no longer tell the events an operator moved past "+
		"from those the stream lost: it stops at each later one NATS refuses",
		p.r.cfg.Stream, pos, refusalLimit(cause), left, p.refillTo, lost, p.r.checkpointSetHint(pos))
	if p.r.toldRefused.Swap(pos) != pos {
		p.r.cfg.Logger.ErrorContext(ctx, "annals: "+err.Error(),
			slog.String("relay", p.r.cfg.Name), slog.String("stream", p.r.cfg.Stream), slog.Int64("position", pos),
			slog.Int64("checkpoint_was", p.refillTo), slog.Int64("events_left", left), slog.Int64("lost_left", lost))
	}
	return err
}

// refusal returns the error NATS would answer the publish of msg (event
// id, chained on prev, or on the sequence seq of an empty stream) with, if
// it refuses it for good (refusedForGood), found before sending from the
// limits the leadership read (the server's max_payload from the
// connection, the stream's max_msg_size and storage from its info) and
// JetStream's (headers up to 65535 bytes; the file store's records up to
// 32 MiB), as nats-server v2.15's processJetStreamMsg and the file store
// measure them: nil when none of them refuses it. A refill checks each
// event before sending, so that no message is chained on one the stream
// refuses (collect's refusal is the fallback, for a limit this does not
// see: one lowered within the leadership, the account's max_payload).
func (p *publisher) refusal(msg *nats.Msg, id, prev string, seq uint64) error {
	m := &nats.Msg{Subject: msg.Subject, Header: maps.Clone(msg.Header), Data: msg.Data}
	own := m.Size() - len(m.Subject) - len(m.Data) // the relay's headers alone
	m.Header.Set(jetstream.MsgIDHeader, id)
	m.Header.Set(jetstream.ExpectedStreamHeader, p.r.cfg.Stream)
	if prev != "" {
		m.Header.Set(jetstream.ExpectedLastMsgIDHeader, prev)
	} else {
		m.Header.Set(jetstream.ExpectedLastSeqHeader, strconv.FormatUint(seq, 10))
	}
	hdr := m.Size() - len(m.Subject) - len(m.Data) // as sent
	size := hdr + len(m.Data)
	switch {
	case int64(size) > p.r.js.Conn().MaxPayload():
		return nats.ErrMaxPayload
	case p.maxMsgSize > 0 && size > int(p.maxMsgSize):
		return &jetstream.APIError{Code: 400, ErrorCode: errCodeMessageExceedsMaximum, Description: "message size exceeds maximum allowed"}
	case hdr > math.MaxUint16:
		return &jetstream.APIError{Code: 400, ErrorCode: errCodeHeaderExceedsMaximum, Description: "header size exceeds maximum allowed of 64k"}
	case p.fileStore && fileStoreRecord(len(m.Subject), own, len(m.Data)) > fileStoreMaxRecord:
		// With the relay's headers alone, the fewest the server may keep.
		return &jetstream.APIError{Code: 503, ErrorCode: errCodeStoreFailed, Description: "message too large"}
	}
	return nil
}

// fileStoreMaxRecord is the file store's largest record (nats-server's
// rlBadThresh), and fileStoreRecord a record's length (fileStoreMsgSizeRaw).
const fileStoreMaxRecord = 32 << 20

func fileStoreRecord(subj, hdr, data int) int {
	return 22 + subj + 4 + hdr + data + 8
}

// refusedForGood reports whether NATS refused a publish for what the
// message is, whatever the stream holds, so that publishing the same event
// again is refused again (only raising a limit, or moving the relay past
// the event, gets the relay on). Such an event of a refill was refused
// when the relay first published it, and moved past by an operator, unless
// a limit was lowered since the stream stored it: passOverInRefill tells
// the two apart by a count. Of the refusals a relay's
// publish can meet (nats.go's PublishMsgAsync, and JetStream's stream.go
// processJetStreamMsg in nats-server v2.15), those are:
//
//   - nats.ErrMaxPayload: over the server's max_payload, headers included
//     (the client refuses it before sending, PublishMsgAsync's error);
//   - 10054, "message size exceeds maximum allowed": over the stream's
//     max_msg_size;
//   - 10097, "header size exceeds maximum allowed of 64k": the headers
//     (Annals-Metadata holds the whole metadata) over 65535 bytes;
//   - 10077 "message too large": over the file store's largest record
//     (32 MiB), under a max_payload above that.
//
// The others are not. A stream full under discard-new limits (max_msgs,
// max_bytes, max_msgs_per_subject: 10077 with those descriptions), the
// account's or the server's resources (10002 and others, 10023) and a
// sealed stream refuse every event alike, until a limit is raised or the
// stream ages messages out: a refill waits for that rather than pass over
// everything the stream lost. The chain's refusals (10070, 10071) and the
// expected stream's (10060) are the relay's own, mended by claiming again.
// A publish the account may not make (permissions) is not answered at all:
// the server drops it and tells the connection (-ERR, the client's
// asynchronous error handler), so the relay sees no acknowledgement, as
// from a slow or unreachable server; after AckTimeout it looks at the
// connection's last error (permissionViolation), reports ErrNotPermitted
// when that names the subject, and ends the leadership, each time, until
// the permission is granted (or an operator moves the relay past the event
// by hand: annals checkpoint set).
func refusedForGood(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var api *jetstream.APIError
	if !errors.As(err, &api) {
		return false
	}
	switch api.ErrorCode {
	case errCodeMessageExceedsMaximum, errCodeHeaderExceedsMaximum:
		return true
	case errCodeStoreFailed:
		return api.Description == "message too large"
	}
	return false
}

// JetStream's error codes (nats-server's jetstream_errors_generated.go) that
// nats.go does not name.
const (
	errCodeMessageExceedsMaximum = jetstream.JSErrCodeStreamMessageExceedsMaximum // 10054
	errCodeHeaderExceedsMaximum  = jetstream.ErrorCode(10097)                     // JSStreamHeaderExceedsMaximumErr
	errCodeStoreFailed           = jetstream.ErrorCode(10077)                     // JSStreamStoreFailedF
)

// refusalLimit names the limit behind a JetStream refusal refusedForGood
// accepts.
func refusalLimit(err error) string {
	var api *jetstream.APIError
	switch {
	case !errors.As(err, &api):
	case api.ErrorCode == errCodeMessageExceedsMaximum:
		return "the stream's max_msg_size"
	case api.ErrorCode == errCodeHeaderExceedsMaximum:
		return "JetStream's 64 KiB of headers: the event's metadata is one"
	case api.ErrorCode == errCodeStoreFailed:
		return "the file store's largest message, 32 MiB"
	}
	return "a limit of the stream or server"
}

// unanswered adds to err, the publish of an event going unacknowledged,
// the reason the connection was told of when it is a permission.
func (p *publisher) unanswered(err error) error {
	if v := permissionViolation(p.r.js.Conn(), p.r.subj.filter); v != nil {
		return errmark.Mark(errors.Wrapf(err, "%v: %v (grant it in the server's configuration)", ErrNotPermitted, v), ErrNotPermitted)
	}
	return err
}

// permissionViolation returns nc's last error when it is NATS refusing the
// connection's user to publish to a subject filter matches (the relay's
// subjects), or to subscribe to (or name as a reply) the inbox JetStream's
// acknowledgements come back on (every publish goes unanswered then); nil
// otherwise. The refusal may name another of the relay's subjects than the
// unacknowledged event's: the connection keeps the newest error only, and
// the relay publishes a batch before it waits for acknowledgements. The
// last error stays until another replaces it, so one older than the publish
// is reported too: the user's permissions refuse the relay's subjects still
// while its publishes go unanswered.
func permissionViolation(nc *nats.Conn, filter string) error {
	err := nc.LastError()
	if err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
		return nil
	}
	inbox := nats.InboxPrefix
	if nc.Opts.InboxPrefix != "" {
		inbox = nc.Opts.InboxPrefix + "."
	}
	msg := err.Error()
	if strings.Contains(msg, `Subscription to "`+inbox) || strings.Contains(msg, `Publish with Reply of "`+inbox) {
		return err
	}
	// nats-server's client.go words it with %q.
	if m := refusedPublish.FindStringSubmatch(msg); m != nil {
		if subject, uerr := strconv.Unquote(m[1]); uerr == nil && subjectCovers(filter, subject) {
			return err
		}
	}
	return nil
}

// refusedPublish finds the subject in nats-server's refusal of a publish.
var refusedPublish = regexp.MustCompile(`Permissions Violation for Publish to ("(?:[^"\\]|\\.)*")`)

// stopPoll is how often a relay that is stopping, waiting for an
// acknowledgement, looks whether NATS is still connected (await).
const stopPoll = 50 * time.Millisecond

// await waits for the acknowledgement of s until timeout or ctx ends; and,
// once the run is stopping (lease.Stopping), no longer than the NATS
// connection is down: no acknowledgement comes before it reconnects, and a
// shutdown during an outage would wait out AckTimeout. What is not
// acknowledged then is abandoned as after any failed publish: the next
// leader publishes it again, chained, from the stream's newest message (the
// client's reconnect buffer may deliver some of it first, which the chain
// and the skip keep to once each).
func (p *publisher) await(ctx context.Context, lease *catchup.Lease, s sent, timeout <-chan time.Time) (*jetstream.PubAck, error) {
	stopping := lease.Stopping()
	var poll <-chan time.Time
	for {
		select {
		case ack := <-s.f.Ok():
			return ack, nil
		case err := <-s.f.Err():
			if errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
				return nil, p.unanswered(err)
			}
			return nil, err
		case <-timeout:
			return nil, p.unanswered(errors.Newf("no acknowledgement within %v", p.r.cfg.AckTimeout))
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-stopping:
			stopping = nil
			t := time.NewTicker(stopPoll)
			defer t.Stop()
			poll = t.C
		case <-poll:
		}
		if poll != nil && !p.r.js.Conn().IsConnected() {
			return nil, errors.New("stopping while NATS is unreachable: not waiting for the acknowledgement (the next leader publishes it again if it was lost)")
		}
	}
}

// commit writes the checkpoint through what is acknowledged and, in the
// same transaction and fenced as it is, the stream's sequence acknowledged
// through it (RecordAcked; behind reads it).
func (p *publisher) commit(ctx context.Context, lease *catchup.Lease) error {
	p.lastCommit = time.Now()
	if p.acked <= p.committed {
		return nil
	}
	q, err := p.r.queries()
	if err != nil {
		return err
	}
	pos, seq := p.acked, int64(p.ackSeq)
	if err := lease.Do(ctx, func(conn *pgx.Conn) error {
		return pgx.BeginTxFunc(ctx, conn, p.r.txOptions(), func(tx pgx.Tx) error {
			if err := lease.Commit(ctx, tx, pos); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, q["RecordAcked"], lease.Subscriber, lease.Partition, lease.Epoch, p.r.cfg.Stream, p.created, seq, pos)
			return errors.Wrapf(notMigrated(err), "relay: record stream sequence %d with the checkpoint", seq)
		})
	}); err != nil {
		return err
	}
	p.committed = pos
	p.r.failures.Store(0) // progress: CatchUp's count of failures starts again
	if p.r.cfg.OnCommitted != nil {
		p.r.cfg.OnCommitted(pos)
	}
	return nil
}

// fail commits what is acknowledged and ends the leadership: the engine
// cannot go back to the first unacknowledged event within one leadership
// (its cursor passed it when the batch was handed over), so the relay
// claims again, from the checkpoint.
func (p *publisher) fail(ctx context.Context, lease *catchup.Lease, cause error) error {
	cause = p.r.unreachable(cause)
	_ = p.collect(ctx, lease, len(p.inflight), false)
	if err := p.commit(ctx, lease); err != nil && !errors.Is(err, checkpoint.ErrFenced) {
		p.r.cfg.Logger.WarnContext(ctx, "annals: relay checkpoint failed", slog.String("relay", p.r.cfg.Name), telemetry.Err(err))
	}
	p.r.cfg.Logger.WarnContext(ctx, "annals: relay publish failed; claiming again from the checkpoint",
		slog.String("relay", p.r.cfg.Name), slog.Int64("checkpoint", p.committed), telemetry.Err(cause))
	// What was in flight is abandoned, not acknowledged: nothing past acked
	// may be committed by the End that follows (synced false: End is a
	// no-op), and the next leadership starts from the checkpoint.
	p.inflight = nil
	p.through = p.acked
	p.synced = false
	p.r.failed(cause)
	return errmark.Mark(errmark.Mark(errors.Wrap(cause, ErrPublish.Error()), ErrPublish), catchup.ErrEndLeadership)
}

func (p *publisher) Redeliver(ctx context.Context, lease *catchup.Lease) error { return nil }

// Idle waits for every acknowledgement and commits the checkpoint.
func (p *publisher) Idle(ctx context.Context, lease *catchup.Lease) error {
	if err := p.collect(ctx, lease, len(p.inflight), true); err != nil {
		return p.fail(ctx, lease, err)
	}
	return p.commit(ctx, lease)
}

// End is Idle at the end of a leadership.
func (p *publisher) End(ctx context.Context, lease *catchup.Lease) error {
	if !p.synced {
		return nil
	}
	return p.Idle(ctx, lease)
}

// txOptions begin the relay's transactions on its lease's connection (a
// checkpoint commit, a move back after a loss) as pgx.BeginFunc does,
// limited to the lock's FreezeTimeout of idle time between statements
// (pgtx.BeginIdle; nothing when it is -1). They hold the
// checkpoint's row, and only run statements: one idle that long belongs to
// a relay that is frozen (SIGSTOP, a paused container), whose lock
// session the server ends after the same time; the server then ends this
// one too, so that the next leader's claim of the row does not wait for
// the frozen process.
func (r *Relay) txOptions() pgx.TxOptions {
	return pgx.TxOptions{BeginQuery: pgtx.BeginIdle(advisorylock.FreezeTimeoutOf(r.cfg.Lock))}
}
