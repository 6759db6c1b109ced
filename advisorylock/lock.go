package advisorylock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
)

//go:embed queries.sql
var queriesSQL string

// q holds the statements of queries.sql. They use no placeholder, so they
// are rendered once.
var q = func() struct{ tryLock, lock, waitUnbounded, unlock, unlockNotify, held, rollback, markSession, tryLocks, unlockAll string } {
	named, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(schemaname.Default))
	if err != nil {
		panic(err) // the file is embedded: a test catches this
	}
	return struct{ tryLock, lock, waitUnbounded, unlock, unlockNotify, held, rollback, markSession, tryLocks, unlockAll string }{
		tryLock:       named["TryLock"],
		lock:          named["Lock"],
		waitUnbounded: named["WaitUnbounded"],
		unlock:        named["Unlock"],
		unlockNotify:  named["UnlockNotify"],
		held:          named["Held"],
		rollback:      named["Rollback"],
		markSession:   named["MarkSession"],
		tryLocks:      named["TryLocks"],
		unlockAll:     named["UnlockAll"],
	}
}()

// closeTimeout bounds closing a connection, and rolling back a transaction
// that a Do left open, when the caller's context does not.
const closeTimeout = 5 * time.Second

// Lock is a session-level advisory lock held by a dedicated connection. It
// is safe for concurrent use; Do, Verify and Release take turns on the
// connection. See the package documentation for its life cycle.
type Lock struct {
	key    string
	k1, k2 int32
	pid    uint32
	conn   *pgx.Conn
	sock   net.Conn    // under conn; Release closes it to cut a Do short
	ctxh   *ctxHandler // conn's context handler
	logger *slog.Logger
	// channel is Config.ReleaseChannel: Release announces the key there.
	channel string

	// turn is the right to use conn, held by Do, Verify and Release. While
	// nobody holds it, the watcher goroutine waits on conn.
	turn chan struct{}
	// The watcher, started and stopped only by whoever holds turn.
	stopWatching context.CancelFunc
	watcherDone  chan struct{}
	watchers     atomic.Int32 // watcher goroutines that started and have not returned, for the tests
	// pingEvery is how often the watcher pings the idle session (0: never),
	// and pingTimeout bounds a ping (see Config.pingEvery, pingTimeout).
	pingEvery, pingTimeout time.Duration
	// nextPing is when the watcher pings next (only the watcher, or whoever
	// holds the turn while none runs, touches it).
	nextPing time.Time
	// pinging is set while the watcher pings (see stopWatcher).
	pinging atomic.Bool

	mu       sync.Mutex
	err      error         // why the lock is no longer held; nil while held
	done     chan struct{} // closed when err is set
	released bool          // Release was called
}

// TryAcquire opens a new connection with connConfig (which must come from
// pgx.ParseConfig; it is copied, not changed) and tries to take the advisory
// lock Key(key) on it with pg_try_advisory_lock. If another session holds
// the lock it closes the connection and returns an error matching
// ErrNotAcquired; it never waits for the lock.
//
// The connection is the lock's alone: it is not pooled, and it lives until
// Release or loss. Point connConfig at PostgreSQL directly or at a pooler in
// session mode (see the package documentation). ctx bounds connecting and
// the lock attempt only.
//
// It marks its server session (only one that holds no advisory lock) and
// tries the lock only on a session with its mark, in the round trip of the
// try: on a server session that a pooler in transaction or statement mode
// shares with another lock session it takes nothing and fails with
// ErrPooledSession.
func TryAcquire(ctx context.Context, connConfig *pgx.ConnConfig, key string, cfg *Config) (*Lock, error) {
	c, conn, handler, err := connectFor(ctx, connConfig, key, cfg)
	if err != nil {
		return nil, err
	}
	// One round trip: the session's mark (see MarkSession) and the try,
	// which takes only on a server session with the mark.
	k1, k2 := Key(key)
	mark := newMark()
	b := &pgx.Batch{}
	b.Queue(q.markSession, mark, c.freezeSetting())
	b.Queue(q.tryLock, k1, k2, mark)
	br := conn.SendBatch(ctx, b)
	marked, _, err := scanMark(br.QueryRow())
	var ok *bool
	if err == nil {
		err = br.QueryRow().Scan(&ok)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return nil, errors.CombineErrors(errors.Wrapf(err, "advisorylock: key %q: try lock", key), closeConn(ctx, conn))
	case ok == nil:
		return nil, errors.CombineErrors(pooledErr(key, marked), closeConn(ctx, conn))
	case !*ok:
		return nil, errors.CombineErrors(errors.Wrapf(ErrNotAcquired, "advisorylock: key %q", key), closeConn(ctx, conn))
	}
	return newLock(ctx, key, conn, handler(conn.PgConn()), &c), nil
}

// Acquire is TryAcquire that waits for the lock: the new session queues
// for it in pg_advisory_lock and gets it the moment its holder's session
// lets go, ahead of every session that only tries (pg_try_advisory_lock
// fails while another session waits in the queue). ctx bounds connecting
// and the wait; when it ends the connection is closed, which takes the
// session out of the queue, and the error wraps ctx's. Nothing else bounds
// the wait: a lock_timeout or statement_timeout of the role or the database
// is lifted for it (and only for it: work done under the lock later runs
// with them). As TryAcquire, it fails with ErrPooledSession, without
// waiting, on a server session that a pooler shares with another lock
// session.
func Acquire(ctx context.Context, connConfig *pgx.ConnConfig, key string, cfg *Config) (*Lock, error) {
	return AcquireQueued(ctx, connConfig, key, cfg, nil)
}

// AcquireQueued is Acquire that calls asking, if not nil, with the backend
// PID of the lock's session once it is connected, just before it asks for
// the lock. A caller that must act only once the session waits in the
// lock's queue (catchup.TakeOver fences the holder then, so that the
// holder cannot take the lock back when it lets go) watches pg_locks for
// that PID: a row for the key, granted or not, means the request is made.
// The PID is the server's own (pg_backend_pid(), read with the session's
// mark in one more round trip), not the one the connection's start-up
// reported, which a pooler such as PgBouncer makes up; the wait then runs
// only on the server session of that PID (ErrPooledSession otherwise).
// asking runs on the goroutine calling AcquireQueued and must not block.
func AcquireQueued(ctx context.Context, connConfig *pgx.ConnConfig, key string, cfg *Config, asking func(pid uint32)) (*Lock, error) {
	c, conn, handler, err := connectFor(ctx, connConfig, key, cfg)
	if err != nil {
		return nil, err
	}
	mark := newMark()
	marked := false
	if asking != nil {
		var pid int32
		marked, pid, err = scanMark(conn.QueryRow(ctx, q.markSession, mark, c.freezeSetting()))
		if err != nil {
			return nil, errors.CombineErrors(errors.Wrapf(err, "advisorylock: key %q: mark the session and read the backend PID", key), closeConn(ctx, conn))
		}
		if !marked {
			return nil, errors.CombineErrors(pooledErr(key, false), closeConn(ctx, conn))
		}
		asking(uint32(pid))
	}
	// One round trip: the wait runs in a transaction whose SET LOCALs lift
	// the server's lock_timeout and statement_timeout for it (a session
	// lock outlives the transaction), on a marked session only (the mark
	// goes first in it when asking did not set it).
	k1, k2 := Key(key)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	if asking == nil {
		b.Queue(q.markSession, mark, c.freezeSetting())
	}
	b.Queue(q.waitUnbounded)
	b.Queue(q.lock, k1, k2, mark)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil && asking == nil {
		marked, _, err = scanMark(br.QueryRow())
	}
	if err == nil {
		_, err = br.Exec()
	}
	var got *bool
	if err == nil {
		err = br.QueryRow().Scan(&got)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if ctx.Err() != nil {
			err = errors.CombineErrors(ctx.Err(), err)
		}
		return nil, errors.CombineErrors(errors.Wrapf(err, "advisorylock: key %q: wait for the lock", key), closeConn(ctx, conn))
	}
	if got == nil {
		return nil, errors.CombineErrors(pooledErr(key, marked), closeConn(ctx, conn))
	}
	return newLock(ctx, key, conn, handler(conn.PgConn()), &c), nil
}

// newMark returns a random value for MarkSession.
func newMark() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails
	return hex.EncodeToString(b[:])
}

// scanMark reads MarkSession's answer: whether it marked the server
// session, and the session's backend PID if it did.
func scanMark(row pgx.Row) (marked bool, pid int32, err error) {
	err = row.Scan(nil, &pid, nil)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, 0, nil
	}
	return err == nil, pid, err
}

// pooledErr is the error of a single lock's session whose lock statement
// found no mark of its own on its server session: marked says whether
// MarkSession marked one.
func pooledErr(key string, marked bool) error {
	if marked {
		return errors.Wrapf(ErrPooledSession, "advisorylock: key %q: the lock statement ran on another server session than the one marked", key)
	}
	return errors.Wrapf(ErrPooledSession, "advisorylock: key %q: the server session holds advisory locks already", key)
}

// connectFor checks key and cfg and opens the lock's own connection for key.
func connectFor(ctx context.Context, connConfig *pgx.ConnConfig, key string, cfg *Config) (Config, *pgx.Conn, func(*pgconn.PgConn) *ctxHandler, error) {
	c, cc, handler, err := prepare(connConfig, cfg)
	if err != nil {
		return c, nil, nil, err
	}
	if key == "" {
		return c, nil, nil, errors.New("advisorylock: key is empty")
	}
	conn, err := c.Connect(ctx, cc)
	if err != nil {
		return c, nil, nil, errors.Wrapf(connectHint(err), "advisorylock: key %q: connect", key)
	}
	return c, conn, handler, nil
}

// prepare checks connConfig and cfg and returns the lock connections'
// settings (see Config.connConfig).
func prepare(connConfig *pgx.ConnConfig, cfg *Config) (Config, *pgx.ConnConfig, func(*pgconn.PgConn) *ctxHandler, error) {
	if connConfig == nil {
		return Config{}, nil, nil, errors.New("advisorylock: connConfig is nil")
	}
	if connConfig.DialFunc == nil || connConfig.BuildContextWatcherHandler == nil || connConfig.BuildFrontend == nil {
		return Config{}, nil, nil, errors.New("advisorylock: connConfig was not created by pgx.ParseConfig")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return c, nil, nil, err
	}
	cc, handler := c.connConfig(connConfig)
	return c, cc, handler, nil
}

// newLock returns the Lock of key, which conn's session holds, and starts
// its watcher. conn must be idle, with no LISTEN active.
func newLock(ctx context.Context, key string, conn *pgx.Conn, h *ctxHandler, c *Config) *Lock {
	k1, k2 := Key(key)
	l := &Lock{
		key:     key,
		k1:      k1,
		k2:      k2,
		pid:     conn.PgConn().PID(),
		conn:    conn,
		sock:    conn.PgConn().Conn(),
		ctxh:    h,
		logger:  c.Logger,
		channel: c.ReleaseChannel,
		turn:    make(chan struct{}, 1),
		done:    make(chan struct{}),

		pingEvery:   c.pingEvery(),
		pingTimeout: c.pingTimeout(),
		nextPing:    time.Now().Add(c.pingEvery()),
	}
	l.startWatching()
	l.logger.DebugContext(ctx, "advisorylock: acquired", slog.String("key", key), slog.Uint64("pid", uint64(l.pid)))
	return l
}

// connectHint explains the connection errors a default Config can cause: a
// pooler that refuses the lock session's start-up parameters, and a server
// too old for client_connection_check_interval.
func connectHint(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if strings.Contains(err.Error(), "unsupported startup parameter") {
		// PgBouncer's answer to the start-up parameters the lock session
		// sends (keepalives, user timeout, check interval; not
		// idle_session_timeout, which MarkSession sets).
		return errors.Wrap(err, "a pooler refused the lock session's start-up parameters: session locks need a direct "+
			"connection to PostgreSQL, or a pooler in session mode (PgBouncer in session mode only: list them in ignore_startup_parameters, "+
			"which drops them, so a dead holder's lock is freed later; in transaction mode, locks would stay on the pooler's server sessions; "+
			"see docs/operations.md, \"PgBouncer and other poolers\")")
	}
	if strings.Contains(err.Error(), "client_connection_check_interval") {
		return errors.Wrap(err, "Config.CheckInterval needs a PostgreSQL 14 or later server on Linux; set it to -1 to leave it unset")
	}
	if strings.Contains(err.Error(), "idle_session_timeout") {
		return errors.Wrap(err, "Config.FreezeTimeout needs a PostgreSQL 14 or later server; set it to -1 to leave it unset")
	}
	return err
}

// Key returns the string the lock was acquired for.
func (l *Lock) Key() string { return l.key }

// PID returns the process ID of the lock's server backend, as in
// pg_stat_activity.pid and pg_locks.pid, as the connection's start-up
// reported it: behind a pooler that makes that value up (PgBouncer), it
// matches neither; AcquireQueued reports the server's own.
func (l *Lock) PID() uint32 { return l.pid }

// Lost returns a channel that is closed when the lock is no longer held:
// when it is lost, and also when it is released. Err says which.
//
// While no Do runs, a goroutine waits on the lock's connection, so the loss
// of the session (the backend terminated, the server gone, the socket dead)
// closes the channel as soon as the client's socket reports it. During a Do
// the loss is noticed when fn's next statement fails.
func (l *Lock) Lost() <-chan struct{} { return l.done }

// Err returns nil while the lock is held; once Lost is closed it returns an
// error matching ErrLost (wrapping the cause) or ErrReleased.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Do runs fn with exclusive use of the lock's connection. Work that must be
// fenced by the lock goes here: a transaction fn runs on conn can only
// commit while the session, and with it the lock, is alive. fn must not
// close conn, keep it after returning, or leave a transaction open (Do rolls
// it back and returns an error).
//
// Calls to Do, Verify and Release take turns, so fn must not call them on
// the same Lock. ctx bounds the wait for the turn (a ping of the watcher's
// in flight included: Do then returns ctx's error, and the turn goes back
// once the ping is over), and fn should use it for
// its statements. With pgx's default context handling a statement whose
// context ends closes the connection, which ends the session and loses the
// lock. A connConfig whose BuildContextWatcherHandler returns a
// pgconn.CancelRequestContextWatcherHandler (with a DeadlineDelay of some
// seconds) has the server cancel the statement instead, and the lock stays.
//
// While fn runs nothing pings the session (see Config.FreezeTimeout): fn
// must not leave conn idle outside a transaction for FreezeTimeout, or the
// server ends the session and the lock is lost. Idle inside a transaction
// it may stay as long as it likes (which is also why a holder frozen in
// the middle of fn's transaction keeps the lock).
//
// If the connection is closed when fn returns, the lock is lost: Do returns
// an error that matches ErrLost and fn's error. After loss or Release, Do
// returns Err without calling fn.
func (l *Lock) Do(ctx context.Context, fn func(conn *pgx.Conn) error) error {
	if fn == nil {
		return errors.New("advisorylock: Do with a nil fn")
	}
	if err := l.takeTurn(ctx); err != nil {
		return err
	}
	defer l.endTurn()

	err := fn(l.conn)
	if l.conn.IsClosed() {
		cause := err
		if cause == nil {
			cause = errors.New("the connection was closed")
		}
		l.markLost(cause)
		if err == nil {
			return l.Err()
		}
		return errors.Wrapf(errmark.Mark(err, ErrLost), "advisorylock: key %q: %s", l.key, ErrLost)
	}
	if l.conn.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		_, rerr := l.conn.Exec(rctx, q.rollback)
		if rerr != nil && l.conn.IsClosed() {
			l.markLost(rerr)
		}
		err = errors.CombineErrors(err, errors.CombineErrors(
			errors.Newf("advisorylock: key %q: fn returned with a transaction open; it was rolled back", l.key),
			errors.Wrap(rerr, "rollback")))
	}
	return err
}

// Verify asks the server whether the lock's session still holds the lock
// (pg_locks). It returns nil if it does. If it does not, or the connection
// is gone, the lock is marked lost and Verify returns Err. Other failures
// (ctx ending while it waits for its turn, say) are returned as they are.
// As in Do, ctx ending during the query closes the connection by default.
//
// The watcher notices a dead session by itself; Verify also catches a lock
// that was unlocked on a live session (pg_advisory_unlock_all in a Do).
func (l *Lock) Verify(ctx context.Context) error {
	if err := l.takeTurn(ctx); err != nil {
		return err
	}
	defer l.endTurn()
	var held bool
	err := l.conn.QueryRow(ctx, q.held, l.k1, l.k2).Scan(&held)
	switch {
	case err != nil && l.conn.IsClosed():
		l.markLost(err)
		return l.Err()
	case err != nil:
		return errors.Wrapf(err, "advisorylock: key %q: verify", l.key)
	case !held:
		l.markLost(errors.New("the session no longer holds it"))
		return l.Err()
	}
	return nil
}

// Release unlocks the lock and closes its connection. It is safe to call
// more than once and after loss; only the first call does anything. It
// closes Lost, and Err then matches ErrReleased (unless the lock was lost
// before).
//
// Release waits for a running Do to return, and for the answer to a ping
// of the watcher's in flight. If ctx ends first, it closes the socket under
// the Do (or the ping), which ends the session and so frees the lock once
// the server notices, and returns ctx's error. If the unlock shows that
// the session no longer held the lock, Release returns an error matching
// ErrLost: whatever ran under the lock since the loss was not protected.
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.released = true
	l.mu.Unlock()

	select {
	case l.turn <- struct{}{}:
	default:
		select {
		case l.turn <- struct{}{}:
		case <-ctx.Done():
			l.setDone(l.releasedErr())
			return errors.CombineErrors(
				errors.Wrapf(ctx.Err(), "advisorylock: key %q: release: Do still running; its connection was closed", l.key),
				l.sock.Close()) // the holder of the turn sees it and finishes closing conn
		}
	}
	defer func() { <-l.turn }()
	var err error
	if !l.stopWatcher(ctx) {
		// A ping in flight has had no answer, and ctx ended: cut it, as a
		// Do is cut above (the watcher then finds the connection closed).
		l.setDone(l.releasedErr())
		err = errors.CombineErrors(
			errors.Wrapf(ctx.Err(), "advisorylock: key %q: release: a ping had no answer; its connection was closed", l.key),
			l.sock.Close())
		l.finishStop()
	}

	if l.Err() == nil && !l.conn.IsClosed() {
		var was bool
		var qerr error
		if l.channel != "" {
			// One round trip: the notice goes out when the statement's
			// implicit transaction commits, after the unlock.
			qerr = l.conn.QueryRow(ctx, q.unlockNotify, l.k1, l.k2, l.channel, l.key).Scan(&was, nil)
		} else {
			qerr = l.conn.QueryRow(ctx, q.unlock, l.k1, l.k2).Scan(&was)
		}
		if qerr != nil {
			err = errors.Wrapf(qerr, "advisorylock: key %q: unlock (closing the connection frees it once the server notices)", l.key)
		} else if !was {
			l.markLost(errors.New("the session no longer held it at release"))
			err = l.Err()
		}
	}
	l.setDone(l.releasedErr())
	err = errors.CombineErrors(err, errors.Wrapf(l.conn.Close(ctx), "advisorylock: key %q: close", l.key))
	l.logger.DebugContext(ctx, "advisorylock: released", slog.String("key", l.key), slog.Uint64("pid", uint64(l.pid)))
	return err
}

// takeTurn waits for exclusive use of the connection and stops the watcher.
// It fails if the lock is no longer held.
func (l *Lock) takeTurn(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return errors.Wrapf(ctx.Err(), "advisorylock: key %q: wait for the connection", l.key)
	}
	if !l.stopWatcher(ctx) {
		// A ping in flight has had no answer, and ctx ended: the turn goes
		// back once the ping is over (answered, or failed: the lock lost).
		go func() {
			l.finishStop()
			l.endTurn()
		}()
		return errors.Wrapf(ctx.Err(), "advisorylock: key %q: wait for the connection (a ping in flight)", l.key)
	}
	if err := l.Err(); err != nil {
		l.endTurn()
		return err
	}
	return nil
}

// endTurn hands the connection back to the watcher, or closes it if the lock
// is no longer held, and gives up the turn.
func (l *Lock) endTurn() {
	if l.Err() == nil {
		if l.conn.IsClosed() {
			l.markLost(errors.New("the connection was closed"))
		} else {
			l.startWatching()
		}
	}
	if l.Err() != nil && !l.conn.IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		if err := l.conn.Close(ctx); err != nil {
			l.logger.Debug("advisorylock: close after loss", slog.String("key", l.key), telemetry.Err(err))
		}
		cancel()
	}
	<-l.turn
}

// markLost records that the lock was lost because of cause.
func (l *Lock) markLost(cause error) {
	err := errors.Wrapf(errmark.Mark(cause, ErrLost), "advisorylock: key %q: %s", l.key, ErrLost)
	if l.setDone(err) {
		l.logger.Warn("advisorylock: lock lost", slog.String("key", l.key), slog.Uint64("pid", uint64(l.pid)), telemetry.Err(cause))
	}
}

func (l *Lock) releasedErr() error { return errors.Wrapf(ErrReleased, "advisorylock: key %q", l.key) }

// setDone sets Err and closes Lost, unless that happened already.
func (l *Lock) setDone(err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return false
	}
	l.err = err
	close(l.done)
	return true
}

// closeConn closes a connection that never became a Lock.
func closeConn(ctx context.Context, conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	return errors.Wrap(conn.Close(ctx), "advisorylock: close")
}
