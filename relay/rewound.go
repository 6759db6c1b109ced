package relay

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
)

// Keys of the stamp a relay puts into the Metadata of each stream it makes
// after it found the log rewound under a stream (see Rewound): the last
// position at which that stream and the log agree, and that stream's name
// and creation time (RFC 3339, nanoseconds, UTC).
const (
	MetadataRewoundAt      = "annals-rewound-at"
	MetadataRewoundStream  = "annals-rewound-stream"
	MetadataRewoundCreated = "annals-rewound-created"
)

// Rewound is a rewind of the log a relay found under its stream: the source
// database was restored from a backup, or failed over to a replica that
// lacked its newest commits, and gave the positions of the events it lost
// to new events. The relay found its stream's newest message past the
// log's head, or another event than the log's at its position, and the
// last position at which the stream and the log agree (the same event ID
// at the same position; 0 when none does). It records it (relay_acks,
// migration 0043) and stamps it into the metadata of each stream it makes
// after (Stamp): a consumer whose last position handled, in that stream or
// one made before it, is past At handled events the log lost, and the new
// stream's events at their positions are others.
type Rewound struct {
	// Stream is the name of the stream found rewound, Created when it was
	// made.
	Stream  string
	Created time.Time
	// At is the last position at which that stream and the log agree.
	At int64
}

// Stamp returns the stream metadata entries of r (MetadataRewoundAt,
// MetadataRewoundStream, MetadataRewoundCreated).
func (r Rewound) Stamp() map[string]string {
	return map[string]string{
		MetadataRewoundAt:      strconv.FormatInt(r.At, 10),
		MetadataRewoundStream:  r.Stream,
		MetadataRewoundCreated: r.Created.UTC().Format(time.RFC3339Nano),
	}
}

// RewoundOf reads the stamp of a stream's metadata (see Rewound.Stamp): ok
// is false when the stream has none; a stamp that does not parse is an
// error.
func RewoundOf(metadata map[string]string) (r Rewound, ok bool, err error) {
	at, ok := metadata[MetadataRewoundAt]
	if !ok {
		return Rewound{}, false, nil
	}
	r.Stream = metadata[MetadataRewoundStream]
	if r.At, err = strconv.ParseInt(at, 10, 64); err != nil || r.At < 0 {
		return Rewound{}, false, errors.Newf("relay: stream metadata %s = %q is not a position", MetadataRewoundAt, at)
	}
	if r.Created, err = time.Parse(time.RFC3339Nano, metadata[MetadataRewoundCreated]); err != nil {
		return Rewound{}, false, errors.Newf("relay: stream metadata %s = %q is not a time (RFC 3339)", MetadataRewoundCreated, metadata[MetadataRewoundCreated])
	}
	return r, true, nil
}

// loadRewound reads the rewind the relay recorded (recordRewound); ok is
// false when none is.
func (r *Relay) loadRewound(ctx context.Context) (rw Rewound, ok bool, err error) {
	q, err := r.queries()
	if err != nil {
		return Rewound{}, false, err
	}
	var created int64
	err = r.pool.QueryRow(ctx, q["LoadRewound"], r.cfg.Name).Scan(&rw.Stream, &created, &rw.At)
	if errors.Is(err, pgx.ErrNoRows) {
		return Rewound{}, false, nil
	}
	if err != nil {
		return Rewound{}, false, errors.Wrap(notMigrated(err), "relay: read the rewind recorded")
	}
	rw.Created = time.Unix(0, created).UTC()
	return rw, true, nil
}

// rewound is called by lastStored when the stream's newest message, this
// relay's and of this log's origin, shows the log rewound (past its head,
// or another event than the log's at its position). It finds where the
// stream and the log last agree (agreed) and records it (RecordRewound:
// kept by the lowest for one stream, replaced by another stream's), once
// per stream and last sequence in a process, and returns what to add to
// the refusal. A failure to find or record it is said there too, and the
// next leadership tries again. With lineage (the message of another
// origin: rewoundElsewhere), the stream is taken as this log's only when
// some of its messages are this log's events (agreed above 0); else
// nothing is recorded.
func (r *Relay) rewound(ctx context.Context, stream jetstream.Stream, st stored, lineage bool) string {
	key := [2]int64{st.created.UnixNano(), int64(st.seq)}
	if k := r.provedRewound.Load(); k != nil && k.key == key {
		return k.said
	}
	at, seq, err := r.agreed(ctx, stream)
	if err == nil && lineage && at == 0 {
		r.provedRewound.Store(&provedRewound{key: key})
		return ""
	}
	if err == nil {
		err = r.recordRewound(ctx, Rewound{Stream: r.cfg.Stream, Created: st.created, At: at}, seq, &at)
	}
	if err != nil {
		r.cfg.Logger.WarnContext(ctx, "annals: the relay found the log rewound under its stream, but not where they last agree; trying again at the next leadership",
			slog.String("relay", r.cfg.Name), slog.String("stream", r.cfg.Stream), slog.String("error", err.Error()))
		return fmt.Sprintf(" (finding where the stream and the log last agree failed: %v)", err)
	}
	said := fmt.Sprintf(". The stream and this log last agree at position %d: recorded, and stamped into the stream the relay makes next (%s), "+
		"so that consumers whose last position handled is past it stop when they move to it (natsconsumer.ErrLogRewound). "+
		"To publish this log into a stream made anew: %s", at, MetadataRewoundAt, r.republishAdvice())
	if lineage {
		said = ". Its earlier messages are this log's events: this log is that one, rewound (adopting the stream would not do: it holds events this log lost)" + said
	}
	r.cfg.Logger.ErrorContext(ctx, "annals: the relay's log was rewound under its JetStream stream (the database restored, or failed over to a replica that lacked its newest commits): "+
		"the stream holds events this log lost. Publish the log into a stream made anew: "+r.republishAdvice()+
		"; consumers past the position where they last agree must rebuild their read models",
		slog.String("relay", r.cfg.Name), slog.String("stream", r.cfg.Stream), slog.Int64("agreed_position", at),
		slog.Uint64("agreed_sequence", seq), slog.Uint64("stream_sequence", st.seq))
	r.provedRewound.Store(&provedRewound{key: key, said: said})
	return said
}

// rewoundElsewhere is called by lastStored when the stream's newest message
// m, this relay's, names another origin (not adopted): a database restored
// from a dump into another cluster (whose system identifier differs), or
// renamed, that is also rewound (m past its head, or another event than
// its own at m's position) is still the log whose events the stream's
// earlier messages carry. When some do (rewound with lineage), the rewind
// is recorded as for this log's origin; a stream whose messages are none of
// this log's events is another log's, and nothing is recorded.
func (r *Relay) rewoundElsewhere(ctx context.Context, stream jetstream.Stream, st stored, m *jetstream.RawStreamMsg) string {
	pos, err := strconv.ParseInt(m.Header.Get(HeaderPosition), 10, 64)
	if err != nil {
		return ""
	}
	head, err := r.store.Head(ctx)
	if err != nil {
		return ""
	}
	if pos <= head {
		q, err := r.queries()
		if err != nil {
			return ""
		}
		id := m.Header.Get(HeaderEventID)
		if id == "" {
			id = m.Header.Get(jetstream.MsgIDHeader)
		}
		var eventID string
		if err := r.pool.QueryRow(ctx, q["EventAt"], pos).Scan(&eventID); err != nil || eventID == id {
			return "" // this log's event, or none to tell: not rewound
		}
	}
	return r.rewound(ctx, stream, st, true)
}

// provedRewound is the stream (creation time, last sequence) whose rewind
// a process found and recorded, and what it said (Relay.rewound).
type provedRewound struct {
	key  [2]int64
	said string
}

// agreed finds the last message of the stream whose event is the log's at
// its position (HeaderEventID against EventAt), by binary search over the
// stream's sequences: the stream is in position order, so it and the log
// agree up to a position and not after it. It returns that message's
// position and sequence; 0, 0 when no message the stream holds agrees
// (what it removed, by MaxAge, cannot tell: every position is taken as
// lost). A position past the log's head does not agree. One at or below
// it that the log holds no event at (scavenged by retention, or a hole the
// rewound log left) tells nothing: the search judges by the stream's next
// message that the log tells about (up to skipUnknown of them), and a run
// of messages that tell nothing counts as not agreeing, so a scavenged
// event can only make the answer lower: consumers are told to rebuild
// rather than left with lost events. About log2(messages) reads of a
// message and index probes, more over a log that retention thinned.
func (r *Relay) agreed(ctx context.Context, stream jetstream.Stream) (int64, uint64, error) {
	q, err := r.queries()
	if err != nil {
		return 0, 0, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, 0, errors.Wrap(err, "relay: stream info")
	}
	head, err := r.store.Head(ctx)
	if err != nil {
		return 0, 0, errors.Wrap(err, "relay: read the head")
	}
	// agrees tells whether m is the log's event at its position; known is
	// false when the log holds no event there, at or below its head.
	agrees := func(m *jetstream.RawStreamMsg) (ok, known bool, pos int64, err error) {
		pos, err = strconv.ParseInt(m.Header.Get(HeaderPosition), 10, 64)
		if err != nil {
			return false, false, 0, errors.Newf("relay: message %d has no position", m.Sequence)
		}
		if pos > head {
			return false, true, pos, nil
		}
		id := m.Header.Get(HeaderEventID)
		if id == "" {
			id = m.Header.Get(jetstream.MsgIDHeader)
		}
		var eventID string
		err = r.pool.QueryRow(ctx, q["EventAt"], pos).Scan(&eventID)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, false, pos, nil
		}
		if err != nil {
			return false, false, 0, errors.Wrapf(err, "relay: read the event at position %d", pos)
		}
		return eventID == id, true, pos, nil
	}
	// lo agrees (FirstSeq-1: none, position 0), hi does not (the newest).
	lo, hi := info.State.FirstSeq-1, info.State.LastSeq
	if info.State.FirstSeq == 0 {
		lo = 0
	}
	var loPos int64
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		// The stream's first message at or after mid (none removed: the
		// stream denies deletes, but MaxAge removes from the start).
		// From mid on, the first message that the log tells about (a
		// few at most): agreeing, lo moves up to it; else every message
		// from mid to it is taken as not agreeing.
		ok, seq, pos := false, mid, int64(0)
		for tries := 0; tries < skipUnknown; tries++ {
			m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
			if errors.Is(err, jetstream.ErrMsgNotFound) || err == nil && m.Sequence >= hi {
				break // no message from seq to before hi
			}
			if err != nil {
				return 0, 0, errors.Wrapf(err, "relay: read message %d", seq)
			}
			var known bool
			if ok, known, pos, err = agrees(m); err != nil {
				return 0, 0, err
			}
			if known {
				seq = m.Sequence
				break
			}
			seq = m.Sequence + 1
		}
		if ok {
			lo, loPos = seq, pos
		} else {
			hi = mid
		}
	}
	if loPos == 0 {
		lo = 0
	}
	return loPos, lo, nil
}

// skipUnknown bounds the stream messages agreed reads at one step of its
// search, past those at positions the log holds no event at.
const skipUnknown = 64

// recordRewound records rw (RecordRewound), the agreed message's sequence
// seq with it, and sets *at to what is recorded: the lowest position found
// for one stream.
func (r *Relay) recordRewound(ctx context.Context, rw Rewound, seq uint64, at *int64) error {
	q, err := r.queries()
	if err != nil {
		return err
	}
	err = r.pool.QueryRow(ctx, q["RecordRewound"], r.cfg.Name, rw.Stream, rw.Created.UnixNano(), int64(seq), rw.At).Scan(at)
	return errors.Wrap(notMigrated(err), "relay: record the rewind")
}
