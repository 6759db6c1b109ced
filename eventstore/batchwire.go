package eventstore

import (
	"context"
	"encoding/binary"
	"math"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The append_batch call on the wire, in PostgreSQL's binary format, written
// by hand. pgx encodes a slice argument element by element through
// reflection, boxing each element in an interface (an allocation each), into
// a buffer it shrinks back to 256 bytes after every query, so a group of 400
// events regrew it from scratch each time: 13% of the client's CPU at 4
// writers × 100 events, and with the garbage it left, a quarter more in the
// collector (docs/benchmarks.md, "The append_batch call in binary"). Here
// each array is written once into a buffer sized up front, and the result
// rows are read from the bytes pgx received, without Scan.

// Type OIDs of append_batch's parameters and result columns.
const (
	oidBool      = 16
	oidInt8      = 20
	oidInt2      = 21
	oidInt4      = 23
	oidText      = 25
	oidUUID      = 2950
	oidTextArr   = 1009
	oidInt8Arr   = 1016
	oidInt4Arr   = 1007
	oidUUIDArr   = 2951
	arrayHeader  = 20 // ndim, has-nulls flag, element OID, length, lower bound
	elementField = 4  // each element's length (-1: NULL)
)

// batchParamOIDs are append_batch's parameter types, in order: streams,
// expected versions, each event's append and number within it, IDs, types,
// payloads, metadata, check_ids.
var batchParamOIDs = []uint32{oidTextArr, oidInt8Arr, oidInt4Arr, oidInt4Arr, oidUUIDArr, oidTextArr, oidTextArr, oidTextArr, oidBool}

// batchResultOIDs are the types of its result columns: stream_id, status,
// event_id, global_sequence, stream_version, actual_version.
var batchResultOIDs = []uint32{oidText, oidInt2, oidUUID, oidInt8, oidInt8, oidInt8}

var (
	batchParamFormats  = []int16{1, 1, 1, 1, 1, 1, 1, 1, 1}
	batchResultFormats = []int16{1, 1, 1, 1, 1, 1}
)

// encodeBatch renders append_batch's nine arguments for group (n events in
// all) in binary format, in one buffer allocated at its final size.
func encodeBatch(group []*pendingAppend, n int, check bool) [][]byte {
	b := make([]byte, 0, batchSize(group, n))
	params := make([][]byte, 9)
	mark := 0
	done := func(i int) {
		params[i] = b[mark:len(b):len(b)]
		mark = len(b)
	}

	b = arrayStart(b, oidText, len(group), false)
	for _, p := range group {
		b = appendElement(b, []byte(p.args.stream))
	}
	done(0)
	anyNull := false
	for _, p := range group {
		if _, ok := p.args.expected.(int64); !ok {
			anyNull = true
		}
	}
	b = arrayStart(b, oidInt8, len(group), anyNull)
	for _, p := range group {
		if v, ok := p.args.expected.(int64); ok {
			b = binary.BigEndian.AppendUint32(b, 8)
			b = binary.BigEndian.AppendUint64(b, uint64(v))
		} else {
			b = binary.BigEndian.AppendUint32(b, math.MaxUint32) // -1: NULL
		}
	}
	done(1)
	b = arrayStart(b, oidInt4, n, false)
	for i, p := range group {
		for range p.args.events {
			b = binary.BigEndian.AppendUint32(b, 4)
			b = binary.BigEndian.AppendUint32(b, uint32(i+1))
		}
	}
	done(2)
	b = arrayStart(b, oidInt4, n, false)
	for _, p := range group {
		for j := range p.args.events {
			b = binary.BigEndian.AppendUint32(b, 4)
			b = binary.BigEndian.AppendUint32(b, uint32(j+1))
		}
	}
	done(3)
	b = arrayStart(b, oidUUID, n, false)
	for _, p := range group {
		for _, e := range p.args.events {
			b = binary.BigEndian.AppendUint32(b, 16)
			b = append(b, e.id[:]...)
		}
	}
	done(4)
	b = arrayStart(b, oidText, n, false)
	for _, p := range group {
		for _, e := range p.args.events {
			b = appendElement(b, []byte(e.typ))
		}
	}
	done(5)
	b = arrayStart(b, oidText, n, false)
	for _, p := range group {
		for _, e := range p.args.events {
			b = appendElement(b, e.data)
		}
	}
	done(6)
	metaNull := false
	for _, p := range group {
		for _, e := range p.args.events {
			metaNull = metaNull || e.meta == nil
		}
	}
	b = arrayStart(b, oidText, n, metaNull)
	for _, p := range group {
		for _, e := range p.args.events {
			if e.meta == nil {
				b = binary.BigEndian.AppendUint32(b, math.MaxUint32)
				continue
			}
			b = appendElement(b, e.meta)
		}
	}
	done(7)
	if check {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	done(8)
	return params
}

// batchSize is the length of encodeBatch's arguments together (so the
// buffer it allocates is never regrown): eight array headers and check_ids;
// per append, its stream and expected version (NULL: no bytes); per event,
// its append and number (int4), ID, type, payload and metadata.
func batchSize(group []*pendingAppend, n int) int {
	size := 8*arrayHeader + 1
	size += len(group) * 2 * elementField
	size += n * (6*elementField + 4 + 4 + 16)
	for _, p := range group {
		size += len(p.args.stream)
		if _, ok := p.args.expected.(int64); ok {
			size += 8
		}
		for _, e := range p.args.events {
			size += len(e.typ) + len(e.data) + len(e.meta)
		}
	}
	return size
}

// arrayStart appends the header of a one-dimensional array of n elements of
// type elem, starting at 1.
func arrayStart(b []byte, elem uint32, n int, hasNull bool) []byte {
	b = binary.BigEndian.AppendUint32(b, 1)
	if hasNull {
		b = binary.BigEndian.AppendUint32(b, 1)
	} else {
		b = binary.BigEndian.AppendUint32(b, 0)
	}
	b = binary.BigEndian.AppendUint32(b, elem)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	return binary.BigEndian.AppendUint32(b, 1)
}

// appendElement appends one non-NULL element: its length, then its bytes.
func appendElement(b, v []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

// batchRow is one row of append_batch's result, read in place: stream is
// valid until the next row.
type batchRow struct {
	stream         []byte
	status         int16
	id             pgtype.UUID // NULL in the rows of refused appends
	seq, ver, actu pgtype.Int8
}

// execBatch runs append_batch with the binary arguments and calls row for
// each result row. In QueryExecModeCacheStatement (pgx's default) it prepares
// the statement on the connection (once: pgx keeps it under its SQL, as its
// statement cache would); in every other mode it sends the statement
// unnamed, with the parameter types: one round trip either way. Those modes
// keep no named statement on the server: QueryExecModeCacheDescribe is the
// one pgx offers for poolers in transaction mode without prepared-statement
// support, where a statement prepared in one transaction may be missing (or
// another client's) on the server connection of the next. That includes
// QueryExecModeSimpleProtocol: pgx cannot render
// these arrays into a statement's text, and the unnamed statement of the
// extended protocol is what poolers in transaction mode (the usual reason
// for that mode) handle. A prepared statement the server no longer has (DEALLOCATE
// ALL, DISCARD ALL) or whose plan no longer fits (append_batch replaced) is
// prepared anew and the call sent again: the server refused it before
// running it.
func (c *committer) execBatch(ctx context.Context, params [][]byte, row func(*batchRow) error) error {
	conn, err := c.s.pool.Acquire(ctx)
	if err != nil {
		return translate(err, "", Any)
	}
	defer conn.Release()
	prepare := c.prepare
	for attempt := 0; ; attempt++ {
		read, err := c.execBatchOnce(ctx, conn.Conn(), prepare, params, row)
		var pgErr *pgconn.PgError
		if prepare && read == 0 && errors.As(err, &pgErr) && (pgErr.Code == "26000" || (pgErr.Code == "0A000" && pgErr.Routine == "RevalidateCachedQuery")) {
			// Forget it here too (the server's Close of a statement it
			// does not have is no error).
			if derr := conn.Conn().Deallocate(ctx, c.s.q.appendBatch); derr == nil && attempt == 0 {
				continue
			}
		}
		return err
	}
}

// execBatchOnce sends the call once and returns how many rows it read.
func (c *committer) execBatchOnce(ctx context.Context, conn *pgx.Conn, prepare bool, params [][]byte, row func(*batchRow) error) (int, error) {
	var rr *pgconn.ResultReader
	if prepare {
		sd, err := conn.Prepare(ctx, c.s.q.appendBatch, c.s.q.appendBatch)
		if err != nil {
			return 0, translate(err, "", Any)
		}
		if err := checkBatchStatement(sd); err != nil {
			return 0, err
		}
		rr = conn.PgConn().ExecPrepared(ctx, sd.Name, params, batchParamFormats, batchResultFormats)
	} else {
		rr = conn.PgConn().ExecParams(ctx, c.s.q.appendBatch, params, batchParamOIDs, batchParamFormats, batchResultFormats)
	}
	var (
		r    batchRow
		read int
		ferr error
	)
	for rr.NextRow() {
		read++
		if ferr != nil {
			continue // read to the end: the connection goes back to the pool
		}
		if ferr = decodeBatchRow(rr.Values(), &r); ferr == nil {
			ferr = row(&r)
		}
	}
	if _, err := rr.Close(); err != nil {
		return read, translate(err, "", Any)
	}
	return read, ferr
}

// checkBatchStatement verifies that the prepared append_batch call has the
// parameter and result types encodeBatch and decodeBatchRow assume.
func checkBatchStatement(sd *pgconn.StatementDescription) error {
	ok := len(sd.ParamOIDs) == len(batchParamOIDs) && len(sd.Fields) == len(batchResultOIDs)
	for i := 0; ok && i < len(sd.ParamOIDs); i++ {
		ok = sd.ParamOIDs[i] == batchParamOIDs[i]
	}
	for i := 0; ok && i < len(sd.Fields); i++ {
		ok = sd.Fields[i].DataTypeOID == batchResultOIDs[i]
	}
	if !ok {
		return errors.Newf("eventstore: append_batch has parameters %v and result types of %d columns, not the %v and %v this client sends and reads (a schema from another annals version?)",
			sd.ParamOIDs, len(sd.Fields), batchParamOIDs, batchResultOIDs)
	}
	return nil
}

// decodeBatchRow reads one result row in binary format.
func decodeBatchRow(v [][]byte, r *batchRow) error {
	if len(v) != len(batchResultOIDs) || v[0] == nil || len(v[1]) != 2 {
		return errors.New("eventstore: read append_batch result: a row of an unexpected shape")
	}
	r.stream = v[0]
	r.status = int16(binary.BigEndian.Uint16(v[1]))
	switch len(v[2]) {
	case 0:
		r.id = pgtype.UUID{}
		if v[2] != nil {
			return errors.New("eventstore: read append_batch result: an empty event ID")
		}
	case 16:
		r.id = pgtype.UUID{Bytes: [16]byte(v[2]), Valid: true}
	default:
		return errors.Newf("eventstore: read append_batch result: an event ID of %d bytes", len(v[2]))
	}
	if err := decodeInt8(v[3], &r.seq); err != nil {
		return err
	}
	if err := decodeInt8(v[4], &r.ver); err != nil {
		return err
	}
	return decodeInt8(v[5], &r.actu)
}

// decodeInt8 reads a bigint in binary format, or NULL (nil).
func decodeInt8(b []byte, dst *pgtype.Int8) error {
	switch len(b) {
	case 0:
		*dst = pgtype.Int8{}
		if b != nil {
			return errors.New("eventstore: read append_batch result: an empty bigint")
		}
	case 8:
		*dst = pgtype.Int8{Int64: int64(binary.BigEndian.Uint64(b)), Valid: true}
	default:
		return errors.Newf("eventstore: read append_batch result: a bigint of %d bytes", len(b))
	}
	return nil
}
