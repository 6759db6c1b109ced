package advisorylock

import (
	"context"
	"time"

	"github.com/cockroachdb/errors"
)

// startWatching starts the watcher: a goroutine that waits on the idle
// connection for anything the server sends. A healthy idle session sends
// nothing (except notifications, if a Do subscribed to some); a terminated
// backend sends a FATAL error and closes the socket, and a dead socket fails
// the read. Either ends the wait with an error, and the lock is lost.
//
// With a FreezeTimeout the watcher also pings the session every third of
// it (Config.pingEvery), so that the server, which ends a session idle for
// FreezeTimeout, never ends a live holder's. The pings keep their cadence
// across Do and Verify (a ping due while one runs is sent as soon as the
// watcher is back): a Do need not send a statement.
//
// The caller holds the turn.
func (l *Lock) startWatching() {
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), watchKey{}, true))
	done := make(chan struct{})
	l.stopWatching, l.watcherDone = cancel, done
	go l.watch(ctx, done)
}

// stopWatcher stops the watcher and waits for it to return, after which the
// caller may use the connection. Stopping sets an immediate deadline on the
// socket (see ctxHandler); pgconn does not close the connection on a read
// timeout, and its message reader resumes a message that was cut in the
// middle, so the connection is left as it was. A ping in flight is not
// cut (pgconn would close the connection): stopWatcher waits for its
// answer, a round trip, or until ctx ends (only then: a watcher that is
// not pinging returns at once, whatever ctx). Then it returns false: the
// watcher, stopping, still uses the connection until watcherDone is
// closed (finishStop waits for that).
//
// The caller holds the turn.
func (l *Lock) stopWatcher(ctx context.Context) bool {
	if l.stopWatching == nil {
		return true
	}
	l.stopWatching()
	// Seen false here, pinging is set, if ever, after the stop, and the
	// watcher then sees the stop before it pings (see watch).
	if l.pinging.Load() {
		select {
		case <-l.watcherDone:
		case <-ctx.Done():
			return false
		}
	}
	l.finishStop()
	return true
}

// finishStop waits for the watcher that stopWatcher stopped to return.
//
// The caller holds the turn.
func (l *Lock) finishStop() {
	<-l.watcherDone
	l.stopWatching, l.watcherDone = nil, nil
}

func (l *Lock) watch(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	l.watchers.Add(1)
	defer l.watchers.Add(-1)
	for {
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if l.pingEvery > 0 {
			// Derived from ctx: its end, too, is the watcher's (ctxHandler).
			wctx, cancel = context.WithDeadline(ctx, l.nextPing)
		}
		err := l.conn.PgConn().WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			// A notification; pgx.Conn keeps it for the next Do to read.
			continue
		case ctx.Err() != nil && !l.conn.IsClosed():
			return // stopped by stopWatcher
		case wctx.Err() != nil && !l.conn.IsClosed():
			// A ping is due, unless the watcher is being stopped (checked
			// after pinging is set: see stopWatcher).
			l.pinging.Store(true)
			if ctx.Err() != nil {
				l.pinging.Store(false)
				return
			}
			err := ping(l.conn, l.pingTimeout)
			l.pinging.Store(false)
			if err != nil {
				l.markLost(errors.Wrap(err, "ping"))
				if !l.conn.IsClosed() {
					// Not a failure of the connection (it would be closed),
					// yet no answer to trust: close it, which frees the lock.
					cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
					_ = l.conn.Close(cctx)
					cancel()
				}
				return
			}
			l.nextPing = time.Now().Add(l.pingEvery)
		default:
			if errors.Is(err, context.Canceled) {
				err = errors.New("the connection was closed") // while the watcher was being stopped
			}
			l.markLost(err)
			return
		}
	}
}
