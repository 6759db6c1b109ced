package annalstest

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CutPool is a pool on a test database whose connections a test can cut,
// to make a connection fail at the worst moment: at once (the transaction
// is gone with the session), or right after a write that carries a
// statement (after a COMMIT is sent, the server commits and the client
// gets an error instead of the answer). Find the connection a transaction
// runs on with Of.
type CutPool struct {
	*pgxpool.Pool
	mu    sync.Mutex
	conns map[int]*CutConn
}

// NewCutPool opens a CutPool on db's database (closed when the test ends).
// Its connections are TCP connections dialled by net.Dialer. Each of
// configure, if any, changes the pool's configuration (a query exec mode,
// the pool's size) before it opens.
func NewCutPool(t testing.TB, db *DB, configure ...func(*pgxpool.Config)) *CutPool {
	t.Helper()
	cp := &CutPool{conns: map[int]*CutConn{}}
	cfg := db.Pool.Config()
	for _, f := range configure {
		f(cfg)
	}
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cc := &CutConn{Conn: c}
		if a, ok := c.LocalAddr().(*net.TCPAddr); ok {
			cp.mu.Lock()
			cp.conns[a.Port] = cc
			cp.mu.Unlock()
		}
		return cc, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cp.Pool = pool
	return cp
}

// Of returns the connection tx runs on, found by its local port (the
// server's inet_client_port()).
func (cp *CutPool) Of(ctx context.Context, tx pgx.Tx) (*CutConn, error) {
	var port int
	if err := tx.QueryRow(ctx, `SELECT inet_client_port()`).Scan(&port); err != nil {
		return nil, errors.Wrap(err, "annalstest: the transaction's client port")
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if c := cp.conns[port]; c != nil {
		return c, nil
	}
	return nil, errors.Newf("annalstest: no connection of the pool on local port %d (not TCP?)", port)
}

// CutConn is a client connection of a CutPool.
type CutConn struct {
	net.Conn
	after  atomic.Pointer[func([]byte) bool]
	before atomic.Pointer[beforeWrite]
	cut    atomic.Bool
}

// beforeWrite is what BeforeNext arms.
type beforeWrite struct {
	match func([]byte) bool
	fn    func()
}

// BeforeNext arms the connection to call fn once, right before the next
// write whose bytes (whole frontend messages) match: a test stops the
// connection's backend there (SIGSTOP), so that the server runs what the
// write sends only later, after the client has seen the connection cut.
func (c *CutConn) BeforeNext(match func(b []byte) bool, fn func()) {
	c.before.Store(&beforeWrite{match: match, fn: fn})
}

// CutNow closes the connection at once.
func (c *CutConn) CutNow() {
	c.cut.Store(true)
	_ = c.Conn.Close()
}

// CutAfter arms the connection to close right after the next write whose
// bytes (whole frontend messages) match: HasExecute, HasCommit.
func (c *CutConn) CutAfter(match func(b []byte) bool) { c.after.Store(&match) }

// StopServerAndCutAfter arms the connection for a COMMIT that its server
// runs late: right before the next write whose bytes match, the
// connection's backend, pid (a server on this machine, as the test
// clusters are), is stopped with SIGSTOP, and right after that write the
// connection is cut. The client sees its connection cut while the server
// has not run what the write sent; it runs it once the backend is
// continued (SIGCONT) and then finds the client gone. stopped, when not
// nil, is called once the backend is stopped; a stop that fails fails t.
func (c *CutConn) StopServerAndCutAfter(t testing.TB, match func(b []byte) bool, pid uint32, stopped func()) {
	c.BeforeNext(match, func() {
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			t.Errorf("annalstest: stop backend %d: %v", pid, err)
			return
		}
		if stopped != nil {
			stopped()
		}
	})
	c.CutAfter(match)
}

// Cut reports whether the connection was cut.
func (c *CutConn) Cut() bool { return c.cut.Load() }

// Write writes b (after what BeforeNext armed, if b matches), then closes the connection if it is armed and b matches.
func (c *CutConn) Write(b []byte) (int, error) {
	if w := c.before.Load(); w != nil && w.match(b) && c.before.CompareAndSwap(w, nil) {
		w.fn()
	}
	n, err := c.Conn.Write(b)
	if m := c.after.Load(); err == nil && m != nil && (*m)(b) && c.after.CompareAndSwap(m, nil) {
		c.CutNow()
	}
	return n, err
}

// HasExecute reports whether b, whole frontend messages, holds an Execute
// ('E') message: the statements of a pipelined batch (a batch's checkpoint
// move and COMMIT, say) go in one write; preparing statements sends none.
func HasExecute(b []byte) bool {
	return hasMessage(b, func(typ byte, _ []byte) bool { return typ == 'E' })
}

// HasCommit reports whether b, whole frontend messages, holds a simple
// Query ('Q') message "commit" (how pgx sends a transaction's COMMIT).
func HasCommit(b []byte) bool {
	return hasMessage(b, func(typ byte, body []byte) bool {
		return typ == 'Q' && strings.EqualFold(strings.TrimRight(string(body), "\x00 ;"), "commit")
	})
}

// hasMessage reports whether one of the whole frontend messages in b
// matches.
func hasMessage(b []byte, match func(typ byte, body []byte) bool) bool {
	for len(b) >= 5 {
		n := int(binary.BigEndian.Uint32(b[1:5]))
		if n < 4 || 1+n > len(b) {
			return false
		}
		if match(b[0], b[5:1+n]) {
			return true
		}
		b = b[1+n:]
	}
	return false
}
