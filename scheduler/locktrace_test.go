package scheduler

import (
	"context"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// lockTracer counts, per connection, the round trips a scheduler sends while
// its transaction may hold the log's ordering lock: those that start after
// an append_events call of the transaction and before its COMMIT or
// ROLLBACK. A pipelined batch that ends with the COMMIT is one round trip
// that starts without the lock, so a claim that sends its appends and its
// COMMIT together counts zero. A ROLLBACK after a failed pipeline (the
// failed transaction keeps the lock until it ends) is counted apart.
// Install it as the pool's ConnConfig.Tracer.
type lockTracer struct {
	mu        sync.Mutex
	held      map[*pgx.Conn]bool
	underLk   int // round trips other than ROLLBACK started while the lock may be held
	rollbacks int // ROLLBACKs started while the lock may be held
	total     int // round trips in all
}

func newLockTracer() *lockTracer { return &lockTracer{held: map[*pgx.Conn]bool{}} }

func (l *lockTracer) start(conn *pgx.Conn, sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total++
	switch {
	case !l.held[conn]:
	case strings.EqualFold(strings.TrimSpace(sql), "rollback"):
		l.rollbacks++
	default:
		l.underLk++
	}
}

// statement updates conn's lock state after sql ran.
func (l *lockTracer) statement(conn *pgx.Conn, sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.ToLower(strings.TrimSpace(sql))
	switch {
	case strings.Contains(s, "append_events("):
		l.held[conn] = true
	case s == "commit" || s == "rollback":
		l.held[conn] = false
	}
}

// counts returns the round trips under the lock (other than ROLLBACK) and
// in all.
func (l *lockTracer) counts() (underLock, total int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.underLk, l.total
}

// rollbacksUnderLock returns the ROLLBACKs sent while the lock may be held.
func (l *lockTracer) rollbacksUnderLock() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rollbacks
}

type sqlKey struct{}

func (l *lockTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.start(conn, d.SQL)
	return context.WithValue(ctx, sqlKey{}, d.SQL) // the end data has no SQL
}

func (l *lockTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(sqlKey{}).(string)
	l.statement(conn, sql)
}

func (l *lockTracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	l.start(conn, "")
	return ctx
}

func (l *lockTracer) TraceBatchQuery(_ context.Context, conn *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.statement(conn, d.SQL)
}

func (l *lockTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
