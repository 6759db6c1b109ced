package projection_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/childproc"
	"github.com/annals-dev/annals/projection"
)

// A leader that stops running while its connections stay up (SIGSTOP: a
// paused container, a debugger) is evicted by the server once its lock
// session has idled for the lock's FreezeTimeout, and a standby takes its
// partition within about FreezeTimeout + LockRetryInterval of the stop. The
// resumed leader finds its lock session gone and stands by; nothing it had
// in hand is applied twice. Before FreezeTimeout, the frozen leader kept
// the partition for as long as it stayed stopped.
func TestFrozenLeaderIsTakenOver(t *testing.T) {
	t.Parallel()
	const freeze = time.Second
	f := newFleet(t, childMode{Kind: kindProjection, BatchSize: 50, FreezeTimeout: freeze})
	f.appendEvents(200)
	leader := f.start("frozen")
	f.waitLeader(leader, 15*time.Second)
	f.waitCaughtUp(15 * time.Second)

	// A runner in this process stands by, as the children do.
	const standby = "parent"
	f.standbyInParent(standby, freeze)

	before := f.checkpoint()
	byLeader := f.appliedBy(leader.ID)
	stopped, resume := leader.Freeze()
	f.appendEvents(100) // for the new leader

	cp := f.waitTakenOver(before, standby, stopped, freeze)
	took := time.Since(stopped)
	t.Logf("SIGSTOP of the leader; %s claimed epoch %d after %v (FreezeTimeout %v, LockRetryInterval %v)",
		standby, cp.Epoch, took.Round(time.Millisecond), freeze, childLockRetry)
	f.waitCaughtUp(15 * time.Second)

	// Resumed, the old leader finds its lock session ended by the server,
	// stops leading and stands by again; it applies nothing more.
	resume()
	// (Its poller finds out in its Wait, "lock session lost", or in its
	// next poll's statement, "lock session failed", whichever comes first.
	// The cause it logs is the server's FATAL "idle-session timeout" when
	// it reads that first, or the socket's error when its write comes
	// first: not asserted.)
	if _, ok := eventually(10*time.Second, func() bool {
		return strings.Contains(leader.Log(), "lock session lost") || strings.Contains(leader.Log(), "lock session failed")
	}); !ok {
		t.Fatalf("the resumed leader did not notice its lock session's end within 10s; it is %s; its log:\n%s", leader.State(), leader.Log())
	}
	f.waitStandingBy(leader)
	f.appendEvents(100)
	end := f.waitCaughtUp(15 * time.Second)
	if h, held := f.holder(); !held || h.App != standby {
		t.Errorf("after the old leader resumed, the lock is held by %+v (held %v), want %s", h, held, standby)
	}
	if cp := f.checkpoint(); cp.Owner != standby {
		t.Errorf("after the old leader resumed: checkpoint %s, want owner %s", cp, standby)
	}
	if n := f.appliedBy(leader.ID); n != byLeader {
		t.Errorf("the frozen leader applied %d events, %d of them after it was stopped", n, n-byLeader)
	}
	if !leader.Alive() {
		t.Errorf("the resumed leader exited: %s", leader.State())
	}
	f.checkExactlyOnce(end.Position)
}

// A leader frozen in the middle of a batch, its transaction idle after a
// handler wrote a row (the handler working, within its HandlerTimeout),
// is taken over as an idle one is; and the frozen transaction, which holds
// the row's lock, is ended by the server once it has been idle for the
// handler timeout plus FreezeTimeout (the batch's
// idle_in_transaction_session_timeout), so the new leader's handler, which
// writes the same row, waits that long and no longer. Before, the frozen
// transaction held the row for as long as the process stayed stopped (the
// test fails on that), and the new leader's attempts at the event would
// fail on their HandlerTimeout one after another until dead-lettered.
func TestLeaderFrozenMidBatchIsTakenOver(t *testing.T) {
	t.Parallel()
	const (
		freeze  = time.Second
		handler = 4 * time.Second
		pause   = 3 * time.Second // the handler's work after its write, within handler
		stream  = "acct-paused"
	)
	f := newFleet(t, childMode{Kind: kindProjection, BatchSize: 50, FreezeTimeout: freeze,
		HandlerTimeout: handler, PauseStream: stream, PauseFor: pause})
	f.appendEvents(100)
	leader := f.start("frozen")
	f.waitLeader(leader, 15*time.Second)
	f.waitCaughtUp(15 * time.Second)
	const standby = "parent"
	f.standbyInParent(standby, freeze)
	before := f.checkpoint()
	byLeader := f.appliedBy(leader.ID)

	// The leader writes the event's rows, then works: its batch's
	// transaction is idle, holding them. Stop it there.
	ctx, cancel := f.ctx()
	defer cancel()
	if _, err := f.b.store.Append(ctx, stream, eventstore.Any, eventstore.NewEvent(Deposited{Amount: 7})); err != nil {
		t.Fatal(err)
	}
	var frozenPID int64
	if _, ok := eventually(10*time.Second, func() bool {
		frozenPID = f.queryInt(`SELECT coalesce(max(pid), 0) FROM pg_stat_activity
		                         WHERE datname = current_database() AND application_name = $1
		                           AND state = 'idle in transaction' AND backend_xid IS NOT NULL`, leader.ID)
		return frozenPID != 0
	}); !ok {
		t.Fatalf("the leader has no batch idle in a transaction that wrote within 10s; it is %s", leader.State())
	}
	stopped, resume := leader.Freeze()
	if n := f.queryInt(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'idle in transaction'`, frozenPID); n != 1 {
		t.Fatalf("the leader's batch was no longer idle in its transaction when the leader was stopped (the pause is %v); rerun", pause)
	}
	f.appendEvents(50) // for the new leader, behind the frozen event

	// The partition is taken over as from a leader frozen while idle.
	cp := f.waitTakenOver(before, standby, stopped, freeze)
	// The frozen transaction was idle from its write (before the stop);
	// the server ends it within handler + freeze of that, and the new
	// leader applies the event then. The rest is slack for a loaded machine.
	if _, ok := eventually(handler+freeze+5*time.Second, func() bool {
		return f.queryInt(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, frozenPID) == 0
	}); !ok {
		t.Fatalf("the frozen batch's transaction (backend %d) is still open %v after the stop", frozenPID, time.Since(stopped))
	}
	ended := time.Since(stopped)
	f.waitCaughtUp(10 * time.Second)
	t.Logf("SIGSTOP of the leader mid-batch; %s led at epoch %d; the frozen transaction ended after %v; caught up after %v (handler timeout %v, FreezeTimeout %v)",
		standby, cp.Epoch, ended.Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond), handler, freeze)

	// Resumed, the old leader finds its sessions ended, stands by, and
	// applies nothing more.
	resume()
	f.waitStandingBy(leader)
	f.appendEvents(50)
	end := f.waitCaughtUp(15 * time.Second)
	if n := f.appliedBy(leader.ID); n != byLeader {
		t.Errorf("the frozen leader applied %d events, %d of them after it was stopped", n, n-byLeader)
	}
	if n := f.queryInt(`SELECT count(*) FROM annals.dead_letters`); n != 0 {
		t.Errorf("%d events were dead-lettered", n)
	}
	if !leader.Alive() {
		t.Errorf("the resumed leader exited: %s", leader.State())
	}
	f.checkExactlyOnce(end.Position)
}

// standbyInParent starts a runner of the balances projection in the test's
// process, tuned as the children are (lock FreezeTimeout freeze), and
// waits until its lock session polls: it stands by. It stops at the end of
// the test.
func (f *fleet) standbyInParent(standby string, freeze time.Duration) {
	t := f.t
	t.Helper()
	pool, err := childproc.Pool(t.Context(), f.b.db.URL, standby)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With(slog.String("instance", standby))
	r, err := projection.NewRunner(pool, &projection.Config{
		InstanceID:        standby,
		PollInterval:      childPoll,
		LockRetryInterval: childLockRetry,
		RetryBackoff:      childRetryBackoff,
		HeartbeatInterval: time.Second,
		Lock:              &advisorylock.Config{CheckInterval: childCheckInterval, FreezeTimeout: freeze, Logger: logger},
		Logger:            logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(recordingBalances(f.b.reg, standby), &projection.Options{BatchSize: 50}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := r.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait(); pool.Close() }) // before the database is dropped
	if _, ok := eventually(20*time.Second, func() bool {
		return f.queryInt(`SELECT count(*) FROM pg_stat_activity
		                    WHERE datname = current_database() AND application_name = $1
		                      AND (query LIKE '%unnest%pg_try_advisory_lock%' OR query LIKE '%pg_locks%unnest%')`, standby) > 0
	}); !ok {
		t.Fatal("the runner in this process has no lock session polling within 20s")
	}
}

// waitTakenOver waits until standby has claimed the partition at an epoch
// past before's, after a leader frozen at stopped: within FreezeTimeout
// (the frozen session's idle time; it pinged at most a third of it before
// the stop) plus a poll (LockRetryInterval ±25%) and the claim; the rest
// is slack for a loaded machine. It returns the checkpoint.
func (f *fleet) waitTakenOver(before cpState, standby string, stopped time.Time, freeze time.Duration) cpState {
	f.t.Helper()
	var cp cpState
	if _, ok := eventually(freeze+childLockRetry*5/4+3*time.Second, func() bool {
		cp = f.checkpoint()
		return cp.Epoch > before.Epoch
	}); !ok {
		h, held := f.holder()
		f.t.Fatalf("no new leader %v after SIGSTOP of the leader: checkpoint %s, lock holder %+v (held %v)", time.Since(stopped), cp, h, held)
	}
	if cp.Owner != standby {
		f.t.Fatalf("%q claimed epoch %d, want the runner in this process", cp.Owner, cp.Epoch)
	}
	return cp
}
