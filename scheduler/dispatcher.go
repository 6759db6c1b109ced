package scheduler

import (
	"context"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/internal/poolconn"
	"github.com/annals-dev/annals/internal/telemetry"
)

// clockJump is how far the Clock may move while the dispatcher sets up its
// sleep before it looks again instead of sleeping: a fake clock moved by a
// test in that moment would otherwise leave it asleep past a due time.
const clockJump = 10 * time.Millisecond

// FireDue makes one pass: it fires every timer due by Clock.Now() and the
// due tick of every cron task registered in this process, and returns how
// many timers and ticks it fired. Work held by another dispatcher is left
// to it. For tests and batch jobs; Run calls it in a loop.
func (s *Scheduler) FireDue(ctx context.Context) (int, error) {
	fired, _, _, err := s.pass(ctx)
	return fired, err
}

// pass fires what is due and returns when to look again (zero: only at the
// poll interval) and whether due work was held by another dispatcher.
func (s *Scheduler) pass(ctx context.Context) (fired int, next time.Time, contended bool, err error) {
	now := s.cfg.Clock.Now()
	n, err := s.fireTimers(ctx, now)
	fired += n
	if err != nil {
		return fired, time.Time{}, false, err
	}
	m, next, contended, err := s.fireTasks(ctx, now)
	fired += m
	if err != nil {
		return fired, time.Time{}, false, err
	}
	var due *time.Time
	if err := s.pool.QueryRow(ctx, s.q.nextDue).Scan(&due); err != nil {
		return fired, time.Time{}, false, errors.Wrap(err, "scheduler: next due timer")
	}
	if due != nil {
		if !due.After(now) {
			contended = true // due, but another dispatcher holds it
		} else if next.IsZero() || due.Before(next) {
			next = *due
		}
	}
	s.prune(ctx, now)
	return fired, next, contended, nil
}

// prune deletes fired ticks older than TickRetention, at most once an hour.
func (s *Scheduler) prune(ctx context.Context, now time.Time) {
	s.mu.Lock()
	if !s.lastPrune.IsZero() && now.Sub(s.lastPrune) < time.Hour && !now.Before(s.lastPrune) {
		s.mu.Unlock()
		return
	}
	s.lastPrune = now
	s.mu.Unlock()
	if _, err := s.pool.Exec(ctx, s.q.pruneTicks, now.Add(-s.cfg.TickRetention), now); err != nil && ctx.Err() == nil {
		s.cfg.Logger.WarnContext(ctx, "annals: pruning old cron ticks failed", telemetry.Err(err))
	}
}

// Run is the dispatcher: it fires due timers and cron ticks until ctx ends,
// then returns nil. It sleeps until the next due time by the Clock (at most
// PollInterval) and wakes early when a timer is scheduled anywhere (NOTIFY
// on TimersChannel, on a connection of its own that it re-opens when lost)
// or a task is added or resumed in this process. Database errors are
// logged and retried with backoff. Run satisfies projection.Service, so a
// projection.Runner can run it beside its subscribers (AddService).
func (s *Scheduler) Run(ctx context.Context) error {
	lctx, cancel := context.WithCancel(ctx)
	listenerDone := make(chan struct{})
	go func() {
		defer close(listenerDone)
		s.listen(lctx)
	}()
	defer func() {
		cancel()
		<-listenerDone
	}()

	errBackoff := 100 * time.Millisecond
	for {
		if ctx.Err() != nil {
			return nil
		}
		_, next, contended, err := s.pass(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			s.cfg.Logger.WarnContext(ctx, "annals: scheduler pass failed; retrying", telemetry.Err(err), "backoff", errBackoff)
			s.wallWait(ctx, errBackoff)
			errBackoff = min(errBackoff*2, 5*time.Second)
			continue
		case contended:
			errBackoff = 100 * time.Millisecond
			s.wallWait(ctx, s.cfg.ContentionBackoff)
			continue
		}
		errBackoff = 100 * time.Millisecond
		s.sleep(ctx, next)
	}
}

// wallWait waits d of wall time, or until woken or ctx ends.
func (s *Scheduler) wallWait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-s.wake:
	case <-t.C:
	}
}

// sleep waits on the Clock until next (zero: PollInterval), at most
// PollInterval, or until woken or ctx ends.
func (s *Scheduler) sleep(ctx context.Context, next time.Time) {
	now := s.cfg.Clock.Now()
	d := s.cfg.PollInterval
	if !next.IsZero() {
		d = min(d, next.Sub(now))
	}
	if d <= 0 {
		return
	}
	after := s.cfg.Clock.After(d)
	if moved := s.cfg.Clock.Now().Sub(now); moved > clockJump || moved < 0 {
		return // the clock jumped while we got ready: look again
	}
	s.sleeping.Add(1)
	select {
	case <-ctx.Done():
	case <-s.wake:
	case <-after:
	}
}

// listen keeps a LISTEN on the timers channel and turns notifications into
// wake-ups, reconnecting (with backoff, in wall time) when the connection is
// lost. Each (re)connection wakes the dispatcher, so a timer scheduled while
// nobody listened is not left waiting for the poll interval.
func (s *Scheduler) listen(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		up, err := s.listenOnce(ctx)
		s.listenUp.Store(false)
		if ctx.Err() != nil {
			return
		}
		if up {
			backoff = 100 * time.Millisecond
		}
		s.cfg.Logger.WarnContext(ctx, "annals: scheduler listener lost its connection; reconnecting",
			"channel", s.channel, telemetry.Err(err), "backoff", backoff)
		s.reconnects.Add(1)
		s.signal()
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (s *Scheduler) listenOnce(ctx context.Context) (up bool, err error) {
	conn, err := poolconn.Connect(ctx, s.pool)
	if err != nil {
		return false, errors.Wrap(err, "scheduler: connect listener")
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		return false, errors.Wrap(err, "scheduler: LISTEN")
	}
	s.listenPID.Store(conn.PgConn().PID())
	s.listenUp.Store(true)
	s.signal()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return true, errors.Wrap(err, "scheduler: wait for notification")
		}
		s.notified.Add(1)
		s.signal()
	}
}
