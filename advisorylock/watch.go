package advisorylock

import (
	"context"

	"github.com/cockroachdb/errors"
)

// startWatching starts the watcher: a goroutine that waits on the idle
// connection for anything the server sends. A healthy idle session sends
// nothing (except notifications, if a Do subscribed to some); a terminated
// backend sends a FATAL error and closes the socket, and a dead socket fails
// the read. Either ends the wait with an error, and the lock is lost.
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
// middle, so the connection is left as it was.
//
// The caller holds the turn.
func (l *Lock) stopWatcher() {
	if l.stopWatching == nil {
		return
	}
	l.stopWatching()
	<-l.watcherDone
	l.stopWatching, l.watcherDone = nil, nil
}

func (l *Lock) watch(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	l.watchers.Add(1)
	defer l.watchers.Add(-1)
	for {
		err := l.conn.PgConn().WaitForNotification(ctx)
		switch {
		case err == nil:
			// A notification; pgx.Conn keeps it for the next Do to read.
			continue
		case ctx.Err() != nil && !l.conn.IsClosed():
			return // stopped by stopWatcher
		default:
			if errors.Is(err, context.Canceled) {
				err = errors.New("the connection was closed") // while the watcher was being stopped
			}
			l.markLost(err)
			return
		}
	}
}
