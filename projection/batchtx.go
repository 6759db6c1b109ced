package projection

import (
	"context"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// errTxOwned is what a handler gets for ending the batch's transaction
// itself: the runner commits it, with the checkpoint.
var errTxOwned = errors.New("projection: the batch's transaction is committed or rolled back by the runner, not by a handler")

// batchTx is the pgx.Tx a projection's handlers get: the batch's
// transaction on the lease's connection, begun lazily so that BEGIN costs
// no round trip of its own (except on a lease's own lock connection, where
// inBatchTx begins it first). It is sent together with the first Exec that
// has arguments (pipelined), or with the checkpoint and COMMIT when no
// handler wrote anything; anything else (Query, QueryRow, SendBatch,
// CopyFrom, Prepare, Conn, Begin, LargeObjects) begins it first, as pgx
// does. Commit and Rollback belong to the runner (batchTx.commit/rollback).
//
// BEGIN comes with the statement setup, when there is one: the
// transaction's idle limit (idleLimit), in the same round trip. The limit
// is per gap between two statements, while HandlerTimeout bounds each
// handler call, and a batch's handlers may run one after another without
// a statement; so between two handler calls a transaction that has sent
// nothing for every is pinged (keepAlive), and a live batch idles at most
// every plus one handler call. A handler call after which the transaction
// has idled for idle - every (it overran its HandlerTimeout, ignoring its
// context) may have had its session ended by the server: it fails as a
// timed-out attempt (overran).
type batchTx struct {
	ctx  context.Context // for Conn and LargeObjects, which take none
	conn *pgx.Conn
	// setup is run right after BEGIN, pipelined with the first statement
	// ("": nothing); beginQuery is BEGIN with it, one simple-protocol
	// string ("": BEGIN alone).
	setup, beginQuery string
	// idle is the transaction's idle limit, every the keepAlive interval
	// (both 0: none); sent is when a statement was last sent, since base
	// (monotonic), tracked only with a limit.
	idle, every time.Duration
	base        time.Time
	sent        time.Duration
	begun       bool   // BEGIN has been sent
	tx          pgx.Tx // a pgx handle on the transaction, for savepoints and large objects
	ended       bool
}

// mark records that a statement is being sent now.
func (t *batchTx) mark() {
	if t.every > 0 {
		t.sent = time.Since(t.base)
	}
}

// idleFor is how long the open transaction has sent nothing (0 when it is
// not open or has no limit).
func (t *batchTx) idleFor() time.Duration {
	if t.every <= 0 || !t.begun || t.ended {
		return 0
	}
	return time.Since(t.base) - t.sent
}

// keepAlive pings the open transaction's session (an empty statement) if
// it has sent nothing for every: see batchTx.
func (t *batchTx) keepAlive(ctx context.Context) error {
	if t.every <= 0 || t.idleFor() < t.every {
		return nil
	}
	t.mark()
	return t.conn.PgConn().Ping(ctx)
}

// overran reports whether the open transaction has idled long enough for
// the server to have ended its session, or nearly: see batchTx.
func (t *batchTx) overran() bool {
	return t.every > 0 && t.idleFor() >= t.idle-t.every
}

func (t *batchTx) begin(ctx context.Context) error {
	if t.ended {
		return pgx.ErrTxClosed
	}
	if t.begun {
		return nil
	}
	t.begun = true
	t.mark()
	_, err := t.conn.Exec(ctx, t.beginSQL())
	return err
}

// beginSQL is BEGIN and the setup, one simple-protocol string (pgx sends a
// statement without arguments that way): one round trip.
func (t *batchTx) beginSQL() string {
	if t.beginQuery == "" {
		return "BEGIN"
	}
	return t.beginQuery
}

// handle returns a pgx transaction handle (pgx.Tx) on the open transaction.
func (t *batchTx) handle(ctx context.Context) (pgx.Tx, error) {
	if t.ended {
		return nil, pgx.ErrTxClosed
	}
	if t.tx != nil {
		return t.tx, nil
	}
	opts := pgx.TxOptions{BeginQuery: t.beginSQL()}
	if t.begun {
		// Already in the transaction: only the handle is wanted.
		opts.BeginQuery = "SELECT"
	}
	t.begun = true
	t.mark()
	tx, err := t.conn.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	t.tx = tx
	return tx, nil
}

// Exec sends BEGIN with the first statement, in one round trip. A statement
// without arguments (pgx runs it with the simple protocol, which allows
// several statements in one string) is not pipelined.
func (t *batchTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.ended {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if t.begun || len(args) == 0 {
		if err := t.begin(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		t.mark()
		return t.conn.Exec(ctx, sql, args...)
	}
	t.begun = true
	t.mark()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	if t.setup != "" {
		b.Queue(t.setup)
	}
	b.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil && t.setup != "" {
		_, err = br.Exec()
	}
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t *batchTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	t.mark()
	return t.conn.Query(ctx, sql, args...)
}

func (t *batchTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.begin(ctx); err != nil {
		return errRow{err}
	}
	t.mark()
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *batchTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.begin(ctx); err != nil {
		return errBatchResults{err}
	}
	t.mark()
	return t.conn.SendBatch(ctx, b)
}

func (t *batchTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	t.mark()
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *batchTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	t.mark()
	return t.conn.Prepare(ctx, name, sql)
}

// Begin starts a pseudo nested transaction (a savepoint), as pgx does.
func (t *batchTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.handle(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

func (t *batchTx) LargeObjects() pgx.LargeObjects {
	tx, err := t.handle(t.ctx)
	if err != nil {
		// pgx.LargeObjects has no way to carry the error: the zero value
		// fails (panics, which the handler call turns into an error) on use.
		return pgx.LargeObjects{}
	}
	return tx.LargeObjects()
}

// Conn returns the connection, with the transaction begun on it.
func (t *batchTx) Conn() *pgx.Conn {
	_ = t.begin(t.ctx) // an error here shows in the caller's next statement
	return t.conn
}

func (t *batchTx) Commit(context.Context) error   { return errTxOwned }
func (t *batchTx) Rollback(context.Context) error { return errTxOwned }

// rollback ends the transaction, if begun. As with pgx, a failed rollback
// closes the connection (its state is unknown): for the lock's connection
// that ends the leadership.
func (t *batchTx) rollback(ctx context.Context) {
	if t.ended || !t.begun {
		t.ended = true
		return
	}
	t.ended = true
	if _, err := t.conn.Exec(ctx, "ROLLBACK"); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = t.conn.Close(cctx)
	}
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatchResults struct{ err error }

func (r errBatchResults) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, r.err }
func (r errBatchResults) Query() (pgx.Rows, error)         { return nil, r.err }
func (r errBatchResults) QueryRow() pgx.Row                { return errRow(r) }
func (r errBatchResults) Close() error                     { return r.err }
func (r errBatchResults) Tx() pgx.Tx                       { return nil }

var _ pgx.Tx = (*batchTx)(nil)
