package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/internal/pgtx"
)

// MetadataRewinds is the key of the stamp a relay puts into the Metadata of
// each stream it makes after it found the log rewound under a stream (see
// Rewound): the rewinds it recorded, as a consumer needs them
// (Rewinds.Stamp), a JSON array of {"stream", "created", "at"}, oldest
// stream first.
const MetadataRewinds = "annals-rewinds"

// Rewound is a rewind of the log a relay found under its stream: the source
// database was restored from a backup, or failed over to a replica that
// lacked its newest commits, and gave the positions of the events it lost
// to new events. The relay found its stream's newest message past the
// log's head, or another event than the log's at its position, and the
// last position at which the stream and the log agree (the same event ID
// at the same position; 0 when none does). It records it (relay_acks.rewinds,
// migration 0043), with the rewinds it found before (Rewinds), and stamps
// them into the metadata of each stream it makes after (Rewinds.Stamp): a
// consumer whose last position handled, in that stream or one made before
// it, is past At handled events the log lost, and the new stream's events
// at their positions are others.
type Rewound struct {
	// Stream is the name of the stream found rewound, Created when it was
	// made (RFC 3339 in JSON, to the nanosecond).
	Stream  string    `json:"stream"`
	Created time.Time `json:"created"`
	// At is the last position at which that stream and the log agree.
	At int64 `json:"at"`
}

// Rewinds are the rewinds a relay found, one per stream, oldest stream
// first (by Created). A log restored twice is rewound twice, under two
// streams (the second made after the first rewind): a consumer whose place
// is in the first, offline through both, is past the first's At if it is
// past the lower of the two, and must stop at the stream made after the
// second, though it never saw the second. So a consumer whose place is in
// the stream made at t is judged by every rewind found under that stream
// or one made after it (Since), the ones made before it being of logs its
// place does not come from.
type Rewinds []Rewound

// maxStamped bounds the rewinds a stamp holds (Rewinds.Stamp): about 100
// bytes each with a stream name of a few characters (at most 255: about 11
// KB at most), far below the 128 KB JetStream allows a stream's metadata.
const maxStamped = 32

// Since returns, of the rewinds found under the stream made at created
// (compared to the microsecond, what a natsconsumer checkpoint keeps) or
// under one made after it, the one whose At is lowest: a consumer whose
// place is in that stream, past its At, handled events the log lost. ok is
// false when there is none (the stream was made after every stream found
// rewound).
func (rs Rewinds) Since(created time.Time) (rw Rewound, ok bool) {
	created = created.Truncate(time.Microsecond)
	for _, r := range rs {
		if created.After(r.Created) || ok && r.At >= rw.At {
			continue
		}
		rw, ok = r, true
	}
	return rw, ok
}

// with returns rs with rw recorded: for a stream recorded already, the
// lower At (a scavenged event may hide agreement, never fake it), another
// stream added in creation order; and the At recorded for rw's stream.
func (rs Rewinds) with(rw Rewound) (Rewinds, int64) {
	out := make(Rewinds, 0, len(rs)+1)
	at, found := rw.At, false
	for _, r := range rs {
		if r.Stream == rw.Stream && r.Created.Equal(rw.Created) {
			r.At = min(r.At, rw.At)
			at, found = r.At, true
		}
		out = append(out, r)
	}
	if !found {
		out = append(out, rw)
	}
	slices.SortStableFunc(out, func(a, b Rewound) int { return a.Created.Compare(b.Created) })
	return out, at
}

// stamped returns what of rs a consumer needs (Since) and at most
// maxStamped of it, oldest stream first. A rewind is left out when one
// under a later stream agrees no further (its At not above): every place
// it concerns, the later one concerns too, and stops it alike. What is
// left has At rising with the streams' age falling; past maxStamped the
// two oldest are taken as one, the later's stream with the earlier's At
// (the lower): consumers placed between the two may be stopped though past
// neither's position only by the later one's; none that the full record
// would stop goes on. (A relay finds 33 rewinds, each agreeing further
// than the one before, only when the log is restored that many times.)
func (rs Rewinds) stamped() Rewinds {
	var out Rewinds
	for i := len(rs) - 1; i >= 0; i-- {
		if len(out) == 0 || rs[i].At < out[0].At {
			out = slices.Insert(out, 0, rs[i])
		}
	}
	for len(out) > maxStamped {
		out[1].At = out[0].At
		out = out[1:]
	}
	return out
}

// Stamp returns the stream metadata entry of rs (MetadataRewinds): the
// rewinds a consumer needs (see Since), at most 32, as JSON; nil when rs is
// empty.
func (rs Rewinds) Stamp() map[string]string {
	st := rs.stamped()
	if len(st) == 0 {
		return nil
	}
	b, err := json.Marshal(st)
	if err != nil { // a time past year 9999
		panic(err)
	}
	return map[string]string{MetadataRewinds: string(b)}
}

// RewindsOf reads the stamp of a stream's metadata (see Rewinds.Stamp): ok
// is false when the stream has none; a stamp that does not parse (or has a
// negative position, or no creation time) is an error.
func RewindsOf(metadata map[string]string) (rs Rewinds, ok bool, err error) {
	v, ok := metadata[MetadataRewinds]
	if !ok {
		return nil, false, nil
	}
	if rs, err = parseRewinds([]byte(v)); err != nil {
		return nil, false, errors.Wrapf(err, "relay: stream metadata %s = %q", MetadataRewinds, v)
	}
	return rs, true, nil
}

// parseRewinds reads rewinds as JSON (Stamp, relay_acks.rewinds).
func parseRewinds(b []byte) (Rewinds, error) {
	var rs Rewinds
	if err := json.Unmarshal(b, &rs); err != nil {
		return nil, errors.Wrap(err, "not rewinds (a JSON array of {stream, created, at})")
	}
	for _, r := range rs {
		if r.At < 0 || r.Created.IsZero() {
			return nil, errors.Newf("a rewind at position %d of a stream made at %s", r.At, r.Created)
		}
	}
	return rs, nil
}

// loadRewinds reads the rewinds the relay recorded (recordRewound), oldest
// stream first; none when it recorded none.
func (r *Relay) loadRewinds(ctx context.Context) (Rewinds, error) {
	q, err := r.queries()
	if err != nil {
		return nil, err
	}
	var raw []byte
	err = r.pool.QueryRow(ctx, q["LoadRewinds"], r.cfg.Name).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, errors.Wrap(notMigrated(err), "relay: read the rewinds recorded")
	}
	rs, err := parseRewinds(raw)
	return rs, errors.Wrap(err, "relay: relay_acks.rewinds")
}

// rewound is called by lastStored when the stream's newest message, this
// relay's and of this log's origin, shows the log rewound (past its head,
// or another event than the log's at its position). It finds where the
// stream and the log last agree (agreed) and records it (recordRewound:
// kept by the lowest for one stream, with every other stream's), once
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
		err = r.recordRewound(ctx, Rewound{Stream: r.cfg.Stream, Created: st.created.UTC(), At: at}, seq, &at)
	}
	if err != nil {
		r.cfg.Logger.WarnContext(ctx, "annals: the relay found the log rewound under its stream, but not where they last agree; trying again at the next leadership",
			slog.String("relay", r.cfg.Name), slog.String("stream", r.cfg.Stream), slog.String("error", err.Error()))
		return fmt.Sprintf(" (finding where the stream and the log last agree failed: %v; do not delete the stream yet: "+
			"the relay records that position, for the stream it makes next, at its next leadership, and a stream made without it "+
			"leaves consumers only the late check of each event)", err)
	}
	said := fmt.Sprintf(". The stream and this log last agree at position %d: recorded, and stamped, with any rewind recorded before, into the stream the relay makes next (%s), "+
		"so that consumers whose last position handled is past it stop when they move to it (natsconsumer.ErrLogRewound). "+
		"To publish this log into a stream made anew: %s", at, MetadataRewinds, r.republishAdvice())
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

// recordRewound records rw with the rewinds recorded before (Rewinds.with:
// the lowest position found for one stream, every stream's kept), making
// the relay's relay_acks row with the agreed message's sequence seq when it
// has none yet (EnsureAcksRow), and sets *at to what is recorded for rw's
// stream.
func (r *Relay) recordRewound(ctx context.Context, rw Rewound, seq uint64, at *int64) error {
	q, err := r.queries()
	if err != nil {
		return err
	}
	// READ COMMITTED whatever the session's default_transaction_isolation:
	// two instances recording at once take turns on the row (LockRewinds),
	// and the second must read what the first recorded; under REPEATABLE
	// READ or SERIALIZABLE its lock would fail to serialize (40001).
	err = pgx.BeginTxFunc(ctx, r.pool, pgtx.ReadCommitted, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, q["EnsureAcksRow"], r.cfg.Name, rw.Stream, rw.Created.UnixNano(), int64(seq), rw.At); err != nil {
			return err
		}
		var raw []byte
		if err := tx.QueryRow(ctx, q["LockRewinds"], r.cfg.Name).Scan(&raw); err != nil {
			return err
		}
		rs, err := parseRewinds(raw)
		if err != nil {
			return errors.Wrap(err, "relay_acks.rewinds")
		}
		rs, *at = rs.with(rw)
		b, err := json.Marshal(rs)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, q["RecordRewinds"], r.cfg.Name, string(b))
		return err
	})
	return errors.Wrap(notMigrated(err), "relay: record the rewind")
}
