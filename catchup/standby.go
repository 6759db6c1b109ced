package catchup

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/internal/schemaname"
)

// DefaultLockRetryInterval is the default Config.LockRetryInterval: how
// often a standby process polls the locks of every partition it stands by
// for. A takeover after a leader's crash then takes about half of it on
// average (plus a round trip), and at most about 1.25× it.
const DefaultLockRetryInterval = 20 * time.Millisecond

// standbyDialTimeout bounds opening the standby session.
const standbyDialTimeout = 30 * time.Second

// releaseChannel is the notification channel on which the engine's locks
// announce a graceful release to the standbys (advisorylock.Config's
// ReleaseChannel). A schema name has at most schemaname.MaxLen (56) bytes,
// so it fits PostgreSQL's 63.
func releaseChannel(schema string) string { return schema + "_locks" }

// standbys is the engine's standing-by machinery: every subscriber
// partition that waits for its lock registers here, and one goroutine polls
// the locks of all of them on one session (an advisorylock.Standby) every
// LockRetryInterval (jittered), or at once when a leader announces a
// release. The session that wins a lock becomes that partition's lock
// connection; the poller opens a new one while partitions still wait, and
// closes it when none does. See the package documentation.
type standbys struct {
	e *Engine

	mu      sync.Mutex
	waiting map[*waiter]struct{}
	running bool
	stopped chan struct{}         // closed when the running poller returns
	current *advisorylock.Standby // the poller's session, nil while it has none
	wake    chan struct{}         // capacity 1: the waiters changed (cuts a backoff short)
}

// waiter is a subscriber partition standing by.
type waiter struct {
	key string
	got chan standbyResult // capacity 1; receives once
}

type standbyResult struct {
	lock *advisorylock.Lock
	err  error
}

func newStandbys(e *Engine) *standbys {
	return &standbys{e: e, waiting: map[*waiter]struct{}{}, wake: make(chan struct{}, 1)}
}

// wait stands by for the lock of key until this process takes it, and
// returns it. It returns an error when ctx ends, and when the standby
// session cannot be opened (the caller backs off and stands by again).
func (s *standbys) wait(ctx context.Context, key string) (*advisorylock.Lock, error) {
	w := &waiter{key: key, got: make(chan standbyResult, 1)}
	s.mu.Lock()
	s.waiting[w] = struct{}{}
	if !s.running {
		s.running = true
		s.stopped = make(chan struct{})
		go s.poll(s.stopped)
	}
	s.changed()
	s.mu.Unlock()
	select {
	case r := <-w.got:
		return r.lock, r.err
	case <-ctx.Done():
	}
	s.mu.Lock()
	delete(s.waiting, w)
	last := len(s.waiting) == 0
	stopped := s.stopped
	if last {
		// Let the poller see that nobody waits and close its session, so
		// that a stopped engine leaves no connection behind.
		s.changed()
	}
	s.mu.Unlock()
	select {
	case r := <-w.got: // delivered before we left
		if r.lock != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = r.lock.Release(rctx)
			cancel()
		}
	default:
	}
	if last {
		select {
		case <-stopped:
		case <-time.After(time.Second): // a dial in progress, or a new waiter keeps it
		}
	}
	return nil, errors.Wrapf(ctx.Err(), "catchup: standing by for %q", key)
}

// changed makes the poller look at the waiters now: it cuts the poller's
// wait for the next poll (or its backoff) short. The caller holds s.mu.
func (s *standbys) changed() {
	if s.current != nil {
		s.current.Interrupt()
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// setCurrent records the poller's session.
func (s *standbys) setCurrent(sb *advisorylock.Standby) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current = sb
}

// deliver hands w its result if it still waits, and reports whether it did.
func (s *standbys) deliver(w *waiter, r standbyResult) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.waiting[w]; !ok {
		return false
	}
	delete(s.waiting, w)
	w.got <- r
	return true
}

// keys returns the distinct keys waited for, in random order (no
// partition is always first in line when one session wins several), and
// the waiters of each. It ends the poller (returning ok false) when nobody
// waits.
func (s *standbys) keys() (keys []string, byKey map[string][]*waiter, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiting) == 0 {
		s.running = false
		s.current = nil
		close(s.stopped)
		return nil, nil, false
	}
	byKey = map[string][]*waiter{}
	for w := range s.waiting {
		if byKey[w.key] == nil {
			keys = append(keys, w.key)
		}
		byKey[w.key] = append(byKey[w.key], w)
	}
	rand.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	return keys, byKey, true
}

// failAll hands err to every waiter.
func (s *standbys) failAll(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := range s.waiting {
		delete(s.waiting, w)
		w.got <- standbyResult{err: err}
	}
}

// hand gives lock to one waiter of its key, or releases it if none waits.
func (s *standbys) hand(lock *advisorylock.Lock, ws []*waiter) {
	for _, w := range ws {
		if s.deliver(w, standbyResult{lock: lock}) {
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = lock.Release(ctx)
}

// poll is the poller goroutine; it returns when nobody waits.
func (s *standbys) poll(stopped chan struct{}) {
	log := s.e.cfg.Logger
	var sb *advisorylock.Standby
	defer func() {
		if sb != nil {
			ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
			_ = sb.Close(ctx)
			cancel()
		}
	}()
	ctx := context.Background()
	backoff := s.e.cfg.RetryBackoff
	for {
		keys, byKey, ok := s.keys()
		if !ok {
			return
		}
		if sb == nil {
			dctx, cancel := context.WithTimeout(ctx, standbyDialTimeout)
			var err error
			sb, err = advisorylock.NewStandby(dctx, s.e.connConfig, s.e.cfg.Lock)
			cancel()
			if err != nil {
				sb = nil
				// The waiters return the error (Run logs it and backs off,
				// CatchUp fails with it), as TryAcquire's would.
				s.failAll(errors.Wrap(err, "catchup: open the standby session"))
				continue
			}
			s.setCurrent(sb)
		}
		lock, won, err := sb.TryLock(ctx, keys)
		switch {
		case err == nil:
			s.setCurrent(nil)
			sb = nil // the session is the lock's now
			s.hand(lock, byKey[keys[won[0]]])
			// The other keys it found free go to new connections, in
			// parallel, racing other standbys fairly; the next poll (on a new
			// session) tries them too.
			for _, i := range won[1:] {
				go s.tryAcquire(keys[i], byKey[keys[i]])
			}
			backoff = s.e.cfg.RetryBackoff
			continue
		case errors.Is(err, advisorylock.ErrNotAcquired):
			backoff = s.e.cfg.RetryBackoff
		default:
			log.Warn("annals: standby session failed; reconnecting", slog.Any("error", err))
			s.setCurrent(nil)
			closeCtx, cancel := context.WithTimeout(ctx, closeTimeout)
			_ = sb.Close(closeCtx)
			cancel()
			sb = nil
			s.sleep(jitter(backoff))
			backoff = min(backoff*2, 30*time.Second)
			continue
		}
		if _, err := sb.Wait(ctx, pollJitter(s.e.cfg.LockRetryInterval)); err != nil {
			log.Warn("annals: standby session lost; reconnecting", slog.Any("error", err))
			s.setCurrent(nil)
			closeCtx, cancel := context.WithTimeout(ctx, closeTimeout)
			_ = sb.Close(closeCtx)
			cancel()
			sb = nil
		}
	}
}

// sleep waits for d or until a partition starts (or stops) waiting.
func (s *standbys) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.wake:
	}
}

// tryAcquire takes key on a connection of its own for one of ws.
func (s *standbys) tryAcquire(key string, ws []*waiter) {
	ctx, cancel := context.WithTimeout(context.Background(), standbyDialTimeout)
	defer cancel()
	lock, err := advisorylock.TryAcquire(ctx, s.e.connConfig, key, s.e.cfg.Lock)
	if err != nil {
		return // taken by someone else, or the next poll's to take
	}
	s.hand(lock, ws)
}

// pollJitter returns d ±25%: standby processes drift apart, yet the longest
// wait stays close to d.
func pollJitter(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2+1)
}

// closeTimeout bounds closing the standby session.
const closeTimeout = 5 * time.Second

// standBy waits, standing by, until this process holds sub's lock, then
// claims the checkpoint (bumping the epoch) and returns the lease.
func (e *Engine) standBy(ctx context.Context, sub *Subscription) (*Lease, error) {
	lock, err := e.standbys.wait(ctx, LockKey(e.schema, sub.Name, sub.Partition))
	if err != nil {
		return nil, err
	}
	return e.claim(ctx, sub, lock)
}

// claim claims the checkpoint of sub for lock's holder: epoch + 1, owner =
// this engine. On failure it releases the lock.
func (e *Engine) claim(ctx context.Context, sub *Subscription, lock *advisorylock.Lock) (*Lease, error) {
	lease := &Lease{Subscriber: sub.Name, Partition: sub.Partition, Lock: lock, checkpoints: e.checkpoints, commitSQL: e.q["CommitFenced"], notifySQL: e.q["NotifyCheckpoint"]}
	err := lock.Do(ctx, func(conn *pgx.Conn) error {
		cp, err := e.checkpoints.Claim(ctx, conn, sub.Name, sub.Partition, e.cfg.Owner)
		lease.Epoch, lease.Start = cp.Epoch, cp.Position
		return err
	})
	if err != nil {
		_ = lock.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	if e.cfg.OnLeadership != nil {
		e.cfg.OnLeadership(sub.Name, sub.Partition, lease.Epoch, true)
	}
	return lease, nil
}

// lockConfig returns cfg with the engine's release channel set, unless it
// names one.
func lockConfig(cfg *advisorylock.Config, schema string) *advisorylock.Config {
	var c advisorylock.Config
	if cfg != nil {
		c = *cfg
	}
	if c.ReleaseChannel == "" {
		c.ReleaseChannel = releaseChannel(schemaname.Or(schema))
	}
	return &c
}
