package catchup

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"
	"time"

	"github.com/google/uuid"

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

// batchHeader is what ReadBatch's header row says about the partition.
type batchHeader struct {
	head, epoch       int64
	stopped           string
	retry, unresolved int
	// archived is the newest archived position (0: nothing archived).
	archived int64
	// checkpoint is the checkpoint's position (0: no row).
	checkpoint int64
}

// ReadBatch's columns: the event's eight, then the header's seven.
const (
	colPosition = iota
	colID
	colStream
	colVersion
	colType
	colData
	colMeta
	colRecorded
	colHead
	colEpoch
	colStopped
	colRetry
	colUnresolved
	colArchived
	colCheckpoint
	batchColumns
)

// binaryResults asks for every column of ReadBatch in binary: the event ID
// as 16 bytes, positions and counts as 8, the time as microseconds.
var binaryResults = pgx.QueryResultFormats{pgx.BinaryFormatCode}

// batchDecoder turns ReadBatch's rows into events. It decodes the wire
// values itself (pgx's RawValues): pgx's generic Scan, with a scan plan
// looked up per column per row, cost about a third of the runner's reading
// CPU. Payloads are copied into an arena, stream IDs and types interned.
type batchDecoder struct {
	arena      arena
	streams    map[string]string
	types      map[string]string
	lastStream string
	lastType   string
}

// intern returns b as a string shared with earlier rows of the batch that
// held the same text: a batch has few event types and, in a long log, runs
// of events of one stream.
func intern(b []byte, last *string, seen map[string]string) string {
	if string(b) == *last {
		return *last
	}
	v, ok := seen[string(b)]
	if !ok {
		v = string(b)
		if len(seen) < 1024 {
			seen[v] = v
		}
	}
	*last = v
	return v
}

// postgresEpoch is 2000-01-01 UTC in microseconds since the Unix epoch: the
// origin of PostgreSQL's binary timestamps.
const postgresEpoch = 946684800 * 1000000

func int8At(v []byte, col int) (int64, error) {
	if len(v) != 8 {
		return 0, errors.Newf("column %d: %d bytes for an int8", col, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// row decodes one binary row into h (the header row) or appends an event.
func (d *batchDecoder) row(vals [][]byte, h *batchHeader, saw *bool, events *[]eventstore.Event) error {
	if len(vals) != batchColumns {
		return errors.Newf("%d columns, want %d", len(vals), batchColumns)
	}
	var err error
	if vals[colPosition] == nil { // the header row
		if h.head, err = int8At(vals[colHead], colHead); err != nil {
			return err
		}
		if h.epoch, err = int8At(vals[colEpoch], colEpoch); err != nil {
			return err
		}
		h.stopped = string(vals[colStopped])
		r, err := int8At(vals[colRetry], colRetry)
		if err != nil {
			return err
		}
		u, err := int8At(vals[colUnresolved], colUnresolved)
		if err != nil {
			return err
		}
		if h.archived, err = int8At(vals[colArchived], colArchived); err != nil {
			return err
		}
		if h.checkpoint, err = int8At(vals[colCheckpoint], colCheckpoint); err != nil {
			return err
		}
		h.retry, h.unresolved, *saw = int(r), int(u), true
		return nil
	}
	var e eventstore.Event
	if e.GlobalSequence, err = int8At(vals[colPosition], colPosition); err != nil {
		return err
	}
	if len(vals[colID]) != 16 {
		return errors.Newf("event %d: %d bytes for a uuid", e.GlobalSequence, len(vals[colID]))
	}
	copy(e.ID[:], vals[colID])
	if vals[colStream] == nil || vals[colType] == nil || vals[colData] == nil || vals[colRecorded] == nil {
		return errors.Newf("event %d: unexpected NULL", e.GlobalSequence)
	}
	e.StreamID = intern(vals[colStream], &d.lastStream, d.streams)
	if e.StreamVersion, err = int8At(vals[colVersion], colVersion); err != nil {
		return err
	}
	e.Type = intern(vals[colType], &d.lastType, d.types)
	e.Data = d.arena.copy(vals[colData])
	us, err := int8At(vals[colRecorded], colRecorded)
	if err != nil {
		return err
	}
	if us == math.MaxInt64 || us == math.MinInt64 {
		return errors.Newf("event %d: recorded_at is infinite", e.GlobalSequence)
	}
	us += postgresEpoch
	e.RecordedAt = time.Unix(us/1000000, (us%1000000)*1000)
	if m := vals[colMeta]; len(m) > 0 && !emptyObject(m) {
		if err := e.Metadata.UnmarshalJSON(m); err != nil {
			return errors.Wrapf(err, "event %d", e.GlobalSequence)
		}
	}
	*events = append(*events, e)
	return nil
}

// scanBatch reads the rows of ReadBatch and returns the header and the
// events, in position order, cut into slices of at most batchSize (each
// allocated at its full size once: a chunk of several batches is not one
// slice grown by copying). Rows come in binary (binaryResults); a
// connection that answers in text (the simple protocol, e.g. behind a
// transaction pooler) is read through pgx's Scan instead.
func scanBatch(rows pgx.Rows, batchSize int) (batchHeader, [][]eventstore.Event, error) {
	defer rows.Close()
	var (
		h      batchHeader
		saw    bool
		chunks [][]eventstore.Event
		cur    []eventstore.Event
	)
	fds := rows.FieldDescriptions()
	binary := len(fds) == batchColumns
	for _, fd := range fds {
		binary = binary && fd.Format == pgx.BinaryFormatCode
	}
	d := batchDecoder{streams: map[string]string{}, types: map[string]string{}}
	for rows.Next() {
		if len(cur) == batchSize {
			chunks = append(chunks, cur)
			cur = nil
		}
		if cur == nil {
			cur = make([]eventstore.Event, 0, batchSize)
		}
		var err error
		if binary {
			err = d.row(rows.RawValues(), &h, &saw, &cur)
		} else {
			err = d.scan(rows, &h, &saw, &cur)
		}
		if err != nil {
			return h, nil, err
		}
	}
	if err := rows.Err(); err != nil {
		return h, nil, err
	}
	if !saw {
		return h, nil, errors.New("no header row")
	}
	if len(cur) > 0 {
		chunks = append(chunks, cur)
	}
	// The query returns the events in position order (an index scan
	// feeding a LIMIT, no sort); the order is what the engine's guarantees
	// rest on, so it is checked, and restored should a plan ever deliver
	// otherwise.
	sorted := true
	for i, c := range chunks {
		sorted = sorted && slices.IsSortedFunc(c, byPosition) &&
			(i == 0 || len(c) == 0 || chunks[i-1][len(chunks[i-1])-1].GlobalSequence < c[0].GlobalSequence)
	}
	if !sorted {
		all := slices.Concat(chunks...)
		slices.SortFunc(all, byPosition)
		chunks = chunks[:0]
		for start := 0; start < len(all); start += batchSize {
			end := min(start+batchSize, len(all))
			chunks = append(chunks, all[start:end:end])
		}
	}
	return h, chunks, nil
}

// scan reads a row answered in text through pgx's Scan.
func (d *batchDecoder) scan(rows pgx.Rows, h *batchHeader, saw *bool, events *[]eventstore.Event) error {
	var (
		pos, version, head, epoch, retry, unresolved, archived, checkpoint *int64
		id                                                                 *uuid.UUID
		stream, typ, stopped                                               *string
		data, meta                                                         []byte
		recorded                                                           *time.Time
	)
	if err := rows.Scan(&pos, &id, &stream, &version, &typ, &data, &meta, &recorded,
		&head, &epoch, &stopped, &retry, &unresolved, &archived, &checkpoint); err != nil {
		return err
	}
	if pos == nil {
		if head == nil || epoch == nil || stopped == nil || retry == nil || unresolved == nil || archived == nil || checkpoint == nil {
			return errors.New("header row with NULLs")
		}
		*h = batchHeader{head: *head, epoch: *epoch, stopped: *stopped, retry: int(*retry), unresolved: int(*unresolved), archived: *archived,
			checkpoint: *checkpoint}
		*saw = true
		return nil
	}
	if id == nil || stream == nil || version == nil || typ == nil || data == nil || recorded == nil {
		return errors.Newf("event %d: unexpected NULL", *pos)
	}
	e := eventstore.Event{GlobalSequence: *pos, ID: *id, StreamVersion: *version, RecordedAt: *recorded,
		StreamID: intern([]byte(*stream), &d.lastStream, d.streams), Type: intern([]byte(*typ), &d.lastType, d.types),
		Data: d.arena.copy(data)}
	if len(meta) > 0 && !emptyObject(meta) {
		if err := e.Metadata.UnmarshalJSON(meta); err != nil {
			return errors.Wrapf(err, "event %d", e.GlobalSequence)
		}
	}
	*events = append(*events, e)
	return nil
}

func byPosition(a, b eventstore.Event) int { return cmp.Compare(a.GlobalSequence, b.GlobalSequence) }

// emptyObject reports whether a JSON document is {} or null (metadata with
// nothing in it), which needs no decoding.
func emptyObject(b []byte) bool {
	s := string(b)
	return s == "{}" || s == "null" || s == "{ }"
}
