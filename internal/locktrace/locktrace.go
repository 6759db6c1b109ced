package locktrace

import (
	"context"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Tracer is a pgx.QueryTracer and pgx.BatchTracer. Safe for concurrent use.
type Tracer struct {
	mu        sync.Mutex
	held      map[*pgx.Conn]int // round trips of the current holding transaction
	underLk   int               // round trips other than ROLLBACK started while the lock may be held
	rollbacks int               // ROLLBACKs started while the lock may be held
	maxHold   int               // the most round trips one transaction sent while holding it
	total     int               // round trips in all
}

// New returns a Tracer.
func New() *Tracer { return &Tracer{held: map[*pgx.Conn]int{}} }

func (l *Tracer) start(conn *pgx.Conn, sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total++
	n, held := l.held[conn]
	switch {
	case !held:
	case strings.EqualFold(strings.TrimSpace(sql), "rollback"):
		l.rollbacks++
	default:
		l.underLk++
		l.held[conn] = n + 1
		l.maxHold = max(l.maxHold, n+1)
	}
}

// statement updates conn's lock state after sql ran.
func (l *Tracer) statement(conn *pgx.Conn, sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.ToLower(strings.TrimSpace(sql))
	switch {
	case strings.Contains(s, "append_events(") || strings.Contains(s, "append_events_json("):
		if _, held := l.held[conn]; !held {
			l.held[conn] = 0
		}
	case s == "commit" || s == "rollback":
		delete(l.held, conn)
	}
}

// Counts returns the round trips sent under the lock (other than ROLLBACK)
// and in all.
func (l *Tracer) Counts() (underLock, total int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.underLk, l.total
}

// RollbacksUnderLock returns the ROLLBACKs sent while the lock may be held.
func (l *Tracer) RollbacksUnderLock() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rollbacks
}

// MaxPerTransaction returns the most round trips (other than ROLLBACK) that
// one transaction sent while it held the lock.
func (l *Tracer) MaxPerTransaction() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.maxHold
}

type sqlKey struct{}

// TraceQueryStart implements pgx.QueryTracer.
func (l *Tracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.start(conn, d.SQL)
	return context.WithValue(ctx, sqlKey{}, d.SQL) // the end data has no SQL
}

// TraceQueryEnd implements pgx.QueryTracer.
func (l *Tracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(sqlKey{}).(string)
	l.statement(conn, sql)
}

// TraceBatchStart implements pgx.BatchTracer.
func (l *Tracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	l.start(conn, "")
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (l *Tracer) TraceBatchQuery(_ context.Context, conn *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.statement(conn, d.SQL)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (l *Tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
