package catchup

import (
	"cmp"
	"slices"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
)

// arenaChunk is the size of the buffers a batch's payloads are copied into.
const arenaChunk = 64 << 10

// arena owns the payload bytes of one batch: pgx hands a scanner bytes that
// point into its read buffer, valid only until the next row, so each payload
// is copied once, into a chunk shared by many payloads, rather than
// allocated on its own (json.RawMessage through pgx would also be validated
// and copied again by json.Unmarshal). A chunk lives as long as any event
// whose payload it holds.
type arena struct{ buf []byte }

// copy returns a copy of b in the arena, with its capacity cut at its length
// so that appending to it cannot overwrite the payload after it. nil stays nil.
func (a *arena) copy(b []byte) []byte {
	if b == nil {
		return nil
	}
	if len(b) > arenaChunk/4 {
		return append(make([]byte, 0, len(b)), b...)
	}
	if cap(a.buf)-len(a.buf) < len(b) {
		a.buf = make([]byte, 0, arenaChunk)
	}
	start := len(a.buf)
	a.buf = append(a.buf, b...)
	return a.buf[start:len(a.buf):len(a.buf)]
}

// bytesInto scans a column into an arena copy (pgx's BytesScanner).
type bytesInto struct {
	a   *arena
	dst *[]byte
}

func (s bytesInto) ScanBytes(b []byte) error {
	*s.dst = s.a.copy(b)
	return nil
}

// interned scans a text column into a string shared with earlier rows of the
// batch that hold the same text: a batch has few event types and, in a long
// log, runs of events of one stream.
type interned struct {
	dst  *string
	seen map[string]string
	last *string
}

func (s interned) ScanBytes(b []byte) error {
	if b == nil {
		return errors.New("unexpected NULL")
	}
	if string(b) == *s.last {
		*s.dst = *s.last
		return nil
	}
	v, ok := s.seen[string(b)]
	if !ok {
		v = string(b)
		if len(s.seen) < 1024 {
			s.seen[v] = v
		}
	}
	*s.dst, *s.last = v, v
	return nil
}

// batchRow is the destination of one row of ReadBatch.
type batchRow struct {
	head, epoch       int64
	stopped           string
	retry, unresolved int
	// archived is the newest archived position (0: none).
	archived   int64
	ev         eventstore.Event
	meta       []byte
	dest       []any
	lastStream string
	lastType   string
}

func newBatchRow() *batchRow {
	r := &batchRow{}
	a := &arena{}
	types, streams := map[string]string{}, map[string]string{}
	r.dest = []any{&r.head, &r.epoch, &r.stopped, &r.retry, &r.unresolved, &r.archived,
		&r.ev.GlobalSequence, (*[16]byte)(&r.ev.ID),
		interned{&r.ev.StreamID, streams, &r.lastStream}, &r.ev.StreamVersion,
		interned{&r.ev.Type, types, &r.lastType},
		bytesInto{a, (*[]byte)(&r.ev.Data)}, bytesInto{a, &r.meta}, &r.ev.RecordedAt}
	return r
}

// scanBatch reads the rows of ReadBatch into b's events and returns the
// header (the same on every row). A row with position 0 carries only the
// header: nothing matched.
func scanBatch(rows pgx.Rows, b *Batch) (batchRow, error) {
	r := newBatchRow()
	_, err := pgx.ForEachRow(rows, r.dest, func() error {
		if r.ev.GlobalSequence == 0 {
			return nil
		}
		e := r.ev
		e.Metadata = eventstore.Metadata{}
		if len(r.meta) > 0 && !emptyObject(r.meta) {
			if err := e.Metadata.UnmarshalJSON(r.meta); err != nil {
				return errors.Wrapf(err, "event %d", e.GlobalSequence)
			}
		}
		b.Events = append(b.Events, e)
		return nil
	})
	out := *r
	out.dest = nil
	// The query returns the page in position order (an index scan feeding a
	// LIMIT, no sort); the order is what the engine's guarantees rest on, so
	// it is checked, and restored should a plan ever deliver otherwise.
	if err == nil && !slices.IsSortedFunc(b.Events, byPosition) {
		slices.SortFunc(b.Events, byPosition)
	}
	return out, err
}

func byPosition(a, b eventstore.Event) int { return cmp.Compare(a.GlobalSequence, b.GlobalSequence) }

// emptyObject reports whether a JSON document is {} or null (metadata with
// nothing in it), which needs no decoding.
func emptyObject(b []byte) bool {
	s := string(b)
	return s == "{}" || s == "null" || s == "{ }"
}
