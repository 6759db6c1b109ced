package catchup

import (
	"context"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/internal/lockkey"
)

// ErrTakeOverTimeout is returned by TakeOver when the subscription's lock
// could not be taken, or its checkpoint claimed (its row was held), within
// the wait it was given.
var ErrTakeOverTimeout = errors.New("catchup: timed out taking over the subscription's lock")

// takeOverPoll is how often TakeOver checks, while it waits in the lock's
// queue, whether a standby claimed the partition before it queued.
const takeOverPoll = 10 * time.Millisecond

// takeOverQueuedPoll is how often TakeOver looks in pg_locks, before it
// fences, for its session's request for the lock.
const takeOverQueuedPoll = time.Millisecond

// takeOverQueuedWait bounds that look: if the request has not shown by
// then (it shows within milliseconds; a server that hides other sessions'
// locks, or a PID that does not match, would keep it hidden for ever),
// TakeOver fences anyway, which is the order of older versions: correct,
// with a window in which the fenced leader may lead once more until the
// re-fence.
const takeOverQueuedWait = 2 * time.Second

// TakeOver makes this engine the leader of sub's partition now, whoever
// leads it, and returns the lease; the caller drives it (Drive) and must
// Release it. It first queues for the lock on a connection of its own
// (PostgreSQL's lock queue: it gets the lock the moment the holder lets go,
// ahead of every standby, since a standby only tries the lock and trying
// fails while someone queues), and once pg_locks shows its request, it
// fences the current leader by bumping the checkpoint's epoch (as an
// operator's checkpoint set does: the leader notices at its next read or
// commit, releases its lock and stands by) and announcing it on the fence
// channel (a leader waiting idle for events is woken by its Listener and
// notices at once, not at its next poll). In that order the fenced leader
// cannot take the lock back as a standby when it lets go. If a standby that
// held the lock before TakeOver queued claims after the fence, TakeOver
// fences again. The fence and the claim ignore the server's lock_timeout
// and statement_timeout, as the wait for the lock does: a checkpoint row
// held for a moment delays them, it does not fail them. It gives up with
// ErrTakeOverTimeout after wait (and when ctx ends, with ctx's error).
func (e *Engine) TakeOver(ctx context.Context, sub *Subscription, wait time.Duration) (*Lease, error) {
	if err := e.validate(sub); err != nil {
		return nil, err
	}
	if sub.Ephemeral {
		return nil, errors.New("catchup: TakeOver of an ephemeral subscription")
	}
	if err := e.CheckLayout(ctx, sub); err != nil {
		return nil, err
	}
	key := LockKey(e.schema, sub.Name, sub.Partition)
	qctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	type result struct {
		lock *advisorylock.Lock
		err  error
	}
	got := make(chan result, 1)
	asking := make(chan uint32, 1)
	go func() {
		lock, err := advisorylock.AcquireQueued(qctx, e.connConfig, key, e.cfg.Lock, func(pid uint32) { asking <- pid })
		got <- result{lock, err}
	}()
	// abandon ends the queued wait and releases the lock if it was taken
	// meanwhile.
	abandon := func() {
		cancel()
		if r := <-got; r.lock != nil {
			_ = r.lock.Release(context.WithoutCancel(ctx))
		}
	}
	done := func(r result) (*Lease, error) {
		if r.err != nil {
			if ctx.Err() == nil && qctx.Err() != nil {
				holder, _, _ := e.LockHolder(context.WithoutCancel(ctx), sub.Name, sub.Partition)
				return nil, errors.Wrapf(ErrTakeOverTimeout, "%s/%d: the lock is still held after %s (by backend pid %d)", sub.Name, sub.Partition, wait, holder)
			}
			return nil, errors.Wrapf(r.err, "catchup: taking over %s/%d", sub.Name, sub.Partition)
		}
		lease := e.newLease(sub)
		lease.Lock = r.lock
		// The claim waits for the checkpoint's row (held by a batch in
		// flight, an operator's transaction) with the server's timeouts
		// lifted: wait bounds it, as it bounds the rest.
		l, err := e.claim(qctx, sub, lease)
		if err != nil && ctx.Err() == nil && qctx.Err() != nil {
			return nil, errors.Wrapf(ErrTakeOverTimeout, "%s/%d: the lock was taken, but the checkpoint's row was still held by another transaction after %s", sub.Name, sub.Partition, wait)
		}
		return l, err
	}

	// Queue, then fence. The lock may come at once (nobody held it): the
	// claim then fences whoever claimed last.
	var pid uint32
	select {
	case r := <-got:
		return done(r)
	case pid = <-asking:
	}
	if e.takeOverSeen != nil {
		pid = e.takeOverSeen(pid)
	}
	k1, k2 := lockkey.Pair(key)
	queued := time.NewTicker(takeOverQueuedPoll)
	defer queued.Stop()
	giveUp := time.Now().Add(takeOverQueuedWait)
	for time.Now().Before(giveUp) {
		var requested bool
		if err := e.pool.QueryRow(qctx, e.q["LockRequested"], k1, k2, int32(pid)).Scan(&requested); err != nil {
			if qctx.Err() != nil {
				return done(<-got) // the queued wait ends too, and says why
			}
			abandon()
			return nil, errors.Wrapf(err, "catchup: taking over %s/%d: look for the queued request", sub.Name, sub.Partition)
		}
		if requested {
			break
		}
		select {
		case r := <-got:
			return done(r)
		case <-queued.C:
		}
	}
	// Fence whoever leads, announced: its next read or commit fails, and an
	// idle leader reads at once.
	fenced, err := e.claimLaidOut(qctx, e.pool, sub)
	if err != nil {
		if qctx.Err() != nil {
			return done(<-got)
		}
		abandon()
		return nil, errors.Wrapf(err, "catchup: fence the leader of %s/%d", sub.Name, sub.Partition)
	}
	tick := time.NewTicker(takeOverPoll)
	defer tick.Stop()
	for {
		select {
		case r := <-got:
			return done(r)
		case <-tick.C:
		}
		cp, err := e.checkpoints.Load(qctx, e.pool, sub.Name, sub.Partition)
		if err != nil {
			if qctx.Err() != nil {
				continue // the queued wait ends too, and says why
			}
			abandon()
			return nil, errors.Wrapf(err, "catchup: taking over %s/%d", sub.Name, sub.Partition)
		}
		if cp.Epoch != fenced.Epoch {
			// A standby that held the lock before we queued claimed after
			// the fence: fence it too.
			if fenced, err = e.claimLaidOut(qctx, e.pool, sub); err != nil && qctx.Err() == nil {
				abandon()
				return nil, errors.Wrapf(err, "catchup: fence the leader of %s/%d", sub.Name, sub.Partition)
			}
		}
	}
}

// Drive processes sub through position target with a lease the caller holds
// (from TakeOver), starting at lease.Start, and returns without releasing the
// lease. Handler failures follow the processor's policy; a read error, a
// lost lock or fencing (checkpoint.ErrFenced) ends it with that error.
func (e *Engine) Drive(ctx context.Context, sub *Subscription, lease *Lease, target int64) error {
	return e.DriveWithin(ctx, ctx, sub, lease, target)
}

// DriveWithin is Drive whose processor calls run under procCtx while the
// drive itself ends with ctx, between batches: a batch under way when ctx
// ends is finished (or ends with procCtx), not cut off. A statement cut
// off on a TakeOver lease's connection closes it, and the lock with it;
// projection's blue/green cut-over bounds its catch-up this way.
func (e *Engine) DriveWithin(ctx, procCtx context.Context, sub *Subscription, lease *Lease, target int64) error {
	if err := e.validate(sub); err != nil {
		return err
	}
	if lease == nil || lease.Lock == nil {
		return errors.New("catchup: Drive needs a lease with a lock (from TakeOver)")
	}
	if lease.Subscriber != sub.Name || lease.Partition != sub.Partition {
		return errors.Newf("catchup: lease of %s/%d used for %s/%d", lease.Subscriber, lease.Partition, sub.Name, sub.Partition)
	}
	return e.lead(ctx, procCtx, sub, lease, target)
}

// Release ends a leadership taken with TakeOver: it releases the lock (and
// closes its connection). Safe to call twice.
func (e *Engine) Release(ctx context.Context, lease *Lease) {
	if lease == nil || lease.Lock == nil {
		return
	}
	e.release(ctx, lease)
}

// LockHolder returns the backend process ID holding the lock of the
// subscriber partition, and whether anyone holds it (a leader or a
// TakeOver is active).
func (e *Engine) LockHolder(ctx context.Context, subscriber string, partition int) (pid int32, held bool, err error) {
	k1, k2 := lockkey.Pair(LockKey(e.schema, subscriber, partition))
	err = e.pool.QueryRow(ctx, e.q["LockHolder"], k1, k2).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, errors.Wrapf(err, "catchup: look up the lock of %s/%d", subscriber, partition)
	}
	return pid, true, nil
}
