package advisorylock

import (
	"context"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Standby is one session that stands by for many locks at once: TryLock
// tries all of them in one statement, and the first it takes becomes a Lock
// on that very session, so taking over costs no new connection. A process
// that stands by for many keys (every partition it does not lead) needs one
// Standby, not a connection per key. See the package documentation.
//
// A Standby is not safe for concurrent use, except for Interrupt.
type Standby struct {
	conn    *pgx.Conn
	sock    net.Conn
	ctxh    *ctxHandler
	cfg     Config
	pid     uint32 // pg_backend_pid() of the marked server session
	mark    string // MarkSession's value on the standby's server session
	spent   bool   // the connection went to a Lock, or was closed
	keys    []string
	k1, k2  []int32
	claimed []int64 // TryLock's result rows, reused
	// pingEvery is how often Wait pings an idle session (0: never), and
	// pingTimeout bounds a ping (see Config.pingEvery, pingTimeout).
	pingEvery, pingTimeout time.Duration
	// used is when the session last ran a statement (the end of the last
	// call that sent one): the server counts its idle time from then.
	used time.Time

	mu          sync.Mutex
	waiting     bool // a Wait reads the socket (under a read deadline)
	interrupted bool // Interrupt came since the last Wait returned: the next read ends at once
}

// NewStandby opens a connection for a Standby with connConfig (as
// TryAcquire does: it must come from pgx.ParseConfig, it is copied, and it
// must reach PostgreSQL directly or through a pooler in session mode) and,
// if cfg names a ReleaseChannel, LISTENs on it. ctx bounds connecting. It
// fails with ErrPooledSession if the server session holds an advisory lock
// already: a pooler handed it another session's.
func NewStandby(ctx context.Context, connConfig *pgx.ConnConfig, cfg *Config) (*Standby, error) {
	c, cc, handler, err := prepare(connConfig, cfg)
	if err != nil {
		return nil, err
	}
	conn, err := c.Connect(ctx, cc)
	if err != nil {
		return nil, errors.Wrap(connectHint(err), "advisorylock: standby: connect")
	}
	mark := newMark()
	batch := &pgx.Batch{}
	batch.Queue(q.markSession, mark, c.freezeSetting())
	if c.ReleaseChannel != "" {
		batch.Queue("LISTEN " + pgx.Identifier{c.ReleaseChannel}.Sanitize())
	}
	br := conn.SendBatch(ctx, batch)
	marked, server, err := scanMark(br.QueryRow())
	if err == nil && !marked {
		err = errors.Wrap(ErrPooledSession, "advisorylock: standby: the server session holds advisory locks already")
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, errors.CombineErrors(errors.Wrap(err, "advisorylock: standby: mark the session and listen"), closeConn(ctx, conn))
	}
	return &Standby{conn: conn, sock: conn.PgConn().Conn(), ctxh: handler(conn.PgConn()), cfg: c, pid: uint32(server), mark: mark,
		pingEvery: c.pingEvery(), pingTimeout: c.pingTimeout(), used: time.Now()}, nil
}

// PID returns the process ID of the standby's server backend, as the
// server reports it (pg_backend_pid(), read with the session's mark): behind
// a pooler, which makes up the one the connection's start-up reports, the
// server's own.
func (s *Standby) PID() uint32 { return s.pid }

// TryLock tries to take each of keys once, in one statement (in the order
// given; the keys must be distinct and non-empty), and never waits. If it
// takes none, it returns an error matching ErrNotAcquired and the Standby
// can try again. If it takes some, won lists their indexes in keys
// (ascending), the returned Lock holds keys[won[0]] on the standby's own
// session, and the Standby is spent: its connection now belongs to the Lock
// (close nothing; make a new Standby to go on standing by). The other keys
// it took in that statement are given back before TryLock returns (a Lock
// holds one key), so the caller can take them with TryAcquire, racing other
// standbys fairly.
//
// Any other error leaves the Standby unusable; Close it.
func (s *Standby) TryLock(ctx context.Context, keys []string) (lock *Lock, won []int, err error) {
	if s.spent {
		return nil, nil, errors.New("advisorylock: standby: TryLock after the session went to a Lock or was closed")
	}
	if len(keys) == 0 {
		return nil, nil, errors.Wrap(ErrNotAcquired, "advisorylock: standby: no keys")
	}
	s.keys, s.k1, s.k2 = s.keys[:0], s.k1[:0], s.k2[:0]
	for _, k := range keys {
		if k == "" {
			return nil, nil, errors.New("advisorylock: standby: a key is empty")
		}
		if slices.Contains(s.keys, k) {
			return nil, nil, errors.Newf("advisorylock: standby: key %q given twice", k)
		}
		k1, k2 := Key(k)
		s.keys, s.k1, s.k2 = append(s.keys, k), append(s.k1, k1), append(s.k2, k2)
	}
	var qerr error // the statement's
	defer func() { s.ran(qerr) }()
	rows, qerr := s.conn.Query(ctx, q.tryLocks, s.k1, s.k2, s.mark)
	if qerr != nil {
		return nil, nil, errors.Wrap(qerr, "advisorylock: standby: try locks")
	}
	s.claimed = s.claimed[:0]
	var i int64
	if _, qerr = pgx.ForEachRow(rows, []any{&i}, func() error { s.claimed = append(s.claimed, i); return nil }); qerr != nil {
		return nil, nil, errors.Wrap(qerr, "advisorylock: standby: try locks")
	}
	if slices.Contains(s.claimed, 0) {
		return nil, nil, errors.WithStack(ErrPooledSession)
	}
	if len(s.claimed) == 0 {
		return nil, nil, errors.Wrapf(ErrNotAcquired, "advisorylock: standby: all %d keys", len(keys))
	}
	won = make([]int, len(s.claimed))
	for j, pos := range s.claimed {
		won[j] = int(pos) - 1
	}
	// The session becomes the Lock of keys[won[0]]: give back the rest and
	// stop listening (a Lock's session gets no notifications), in one round
	// trip, then drop notifications that arrived meanwhile.
	s.spent = true
	batch := &pgx.Batch{}
	if len(won) > 1 {
		var r1, r2 []int32
		for _, w := range won[1:] {
			r1, r2 = append(r1, s.k1[w]), append(r2, s.k2[w])
		}
		batch.Queue(q.unlockAll, r1, r2)
	}
	if s.cfg.ReleaseChannel != "" {
		batch.Queue("UNLISTEN *")
	}
	if batch.Len() > 0 {
		if err := s.conn.SendBatch(ctx, batch).Close(); err != nil {
			// Closing the session frees whatever it took.
			return nil, nil, errors.CombineErrors(errors.Wrap(err, "advisorylock: standby: give back the other keys"), closeConn(ctx, s.conn))
		}
	}
	s.drainNotifications()
	return newLock(ctx, keys[won[0]], s.conn, s.ctxh, &s.cfg), won, nil
}

// drainNotifications drops the notifications pgx has buffered.
func (s *Standby) drainNotifications() {
	for {
		// With a done context pgx returns a buffered notification or,
		// without one, an error before it touches the connection.
		if n, _ := s.conn.WaitForNotification(doneContext); n == nil {
			return
		}
	}
}

// Wait returns after d, when a lock is announced released on the
// ReleaseChannel (announced is then true; a notification that arrived
// during the last TryLock counts), when Interrupt is called (also if it was
// called since the last Wait), or when ctx ends; the Standby stays usable.
// It returns an error if the session is gone (the server closed it, or the
// socket died); Close the Standby then.
//
// It waits with a read deadline on the socket, which pgconn survives (a
// timeout is not fatal to it), not with a context: a standby waits about
// fifty times a second, and this costs a timer and no goroutine.
//
// With a FreezeTimeout, Wait pings the session (an empty statement) when
// it has run no statement for a third of it, as often as needed during a
// long Wait, and before it returns if one is due (a Wait that a
// notification or Interrupt ends at once), so that the server, which ends
// a session idle for FreezeTimeout, never ends a Standby that waits. A
// Standby used otherwise (one that holds locks taken with Take, say) must
// run a statement or call Wait at least that often. Only statements that
// reached the server count (TryLock, Take, Give, pings; not what Do's fn
// runs).
func (s *Standby) Wait(ctx context.Context, d time.Duration) (announced bool, err error) {
	if s.spent {
		return false, errors.New("advisorylock: standby: Wait after the session went to a Lock or was closed")
	}
	announced, err = s.wait(ctx, d)
	if err == nil && s.pingEvery > 0 && time.Since(s.used) >= s.pingEvery {
		// A ping came due, and the wait ended before it (a notification,
		// Interrupt): a standby whose Waits all end so is pinged too.
		err = s.ping()
	}
	return announced, err
}

// wait is Wait, but for a ping due when it ends.
func (s *Standby) wait(ctx context.Context, d time.Duration) (announced bool, err error) {
	if n, _ := s.conn.WaitForNotification(doneContext); n != nil {
		return true, nil // buffered during TryLock
	}
	end := time.Now().Add(d)
	stop := context.AfterFunc(ctx, s.Interrupt)
	defer stop()
	for {
		s.mu.Lock()
		if s.interrupted || ctx.Err() != nil {
			s.interrupted = false
			s.mu.Unlock()
			return false, nil
		}
		until, pingDue := end, false
		if s.pingEvery > 0 {
			if due := s.used.Add(s.pingEvery); due.Before(end) {
				until, pingDue = due, true
			}
		}
		s.waiting = true
		err = s.sock.SetReadDeadline(until)
		s.mu.Unlock()
		if err != nil {
			s.endWait()
			return false, errors.Wrap(err, "advisorylock: standby: set the read deadline")
		}
		n, err := s.conn.WaitForNotification(context.Background())
		interrupted := s.endRead()
		switch {
		case n != nil:
			s.endWait()
			return true, nil
		case err == nil:
			s.endWait()
			return false, nil
		case !pgconn.Timeout(err) || s.conn.IsClosed():
			s.endWait()
			return false, errors.Wrap(err, "advisorylock: standby: session lost")
		case interrupted || !pingDue:
			s.endWait()
			return false, nil
		}
		// A ping is due before the wait is over. Interrupt does not cut it
		// (pgconn would close the connection): the loop looks at it after.
		if err := s.ping(); err != nil {
			s.endWait()
			return false, err
		}
	}
}

// ping pings the session (see Wait).
func (s *Standby) ping() error {
	err := ping(s.conn, s.pingTimeout)
	s.ran(err)
	return errors.Wrap(err, "advisorylock: standby: session lost (ping)")
}

// ran notes that the session ran a statement just now, unless err, the
// statement's error, says that it may not have reached the server (only
// the server's answer, success or an error of its own, says it did). The
// next ping is due a third of FreezeTimeout after the last statement that
// ran: counting one that did not would put it off past the server's
// timeout.
func (s *Standby) ran(err error) {
	var pgErr *pgconn.PgError
	if err == nil || errors.As(err, &pgErr) {
		s.used = time.Now()
	}
}

// endRead ends a Wait's read: no deadline; it reports whether Interrupt
// was called meanwhile (which it leaves pending).
func (s *Standby) endRead() (interrupted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting = false
	_ = s.sock.SetReadDeadline(time.Time{}) // fails only on a closed socket, which the next use reports
	return s.interrupted
}

// endWait ends a Wait: no deadline, no interrupt pending (the caller is
// about to poll anyway).
func (s *Standby) endWait() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting, s.interrupted = false, false
	_ = s.sock.SetReadDeadline(time.Time{}) // as in endRead
}

// Interrupt makes the Wait in progress return at once, or, if none is in
// progress, the next one. Safe to call from any goroutine, at any time (it
// does nothing to a spent Standby's connection).
func (s *Standby) Interrupt() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.interrupted = true
	if s.waiting {
		_ = s.sock.SetReadDeadline(time.Now()) // as in endRead
	}
}

// doneContext is a context that is already done.
var doneContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// Close closes the standby's connection (which frees nothing it holds: a
// Standby holds no lock between calls). A no-op once its session went to a
// Lock.
func (s *Standby) Close(ctx context.Context) error {
	if s.spent {
		return nil
	}
	s.spent = true
	return closeConn(ctx, s.conn)
}
