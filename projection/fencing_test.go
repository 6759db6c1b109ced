package projection_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// lockHolders returns the backends of the test database that hold the
// advisory lock of the subscriber's partition 0.
func (h *liveHarness) lockHolders(sub string) []int32 {
	h.t.Helper()
	k1, k2 := advisorylock.Key(catchup.LockKey("annals", sub, 0))
	rows, err := h.pool.Query(context.Background(), `
		SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE l.locktype = 'advisory' AND l.granted AND a.datname = current_database()
		   AND l.classid = ($1::int4::int8 & 4294967295)::oid
		   AND l.objid = ($2::int4::int8 & 4294967295)::oid
		   AND l.objsubid = 2`, k1, k2)
	if err != nil {
		h.t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		h.t.Fatal(err)
	}
	return pids
}

// blockOnce returns a before-hook that, the first time it sees the event at
// position pos, closes entered and waits for release.
func blockOnce(pos int64) (hook func(context.Context, eventstore.Event) error, entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook = func(ctx context.Context, e eventstore.Event) error {
		if e.GlobalSequence != pos {
			return nil
		}
		once.Do(func() {
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
		return nil
	}
	return hook, entered, release
}

// TestFencing is the contract's item 6: a processor that has lost its lock
// can commit neither its read-model writes nor its checkpoint, and a
// checkpoint moved by someone else (a new leader, an operator) is never
// overwritten by a stale leader.
func TestFencing(t *testing.T) {
	t.Parallel()
	const sub = "fenced"

	// setup appends 10 events and starts runner A, whose handler blocks at
	// position 5 of its first batch (1..10) after applying 1..4 in the
	// batch's transaction. It returns once A blocks, with A's lock
	// backend terminated and the lock free again.
	setup := func(t *testing.T) (h *liveHarness, a *seenProjection, release chan struct{}) {
		t.Helper()
		h = newLiveHarness(t)
		h.appendEvents(10, 3)
		hook, entered, release := blockOnce(5)
		a = &seenProjection{name: sub, writer: "A", before: hook}
		h.run(h.newRunner(testConfig(time.Second), &projection.Options{BatchSize: 100}, a))
		t.Cleanup(func() {
			select {
			case <-release:
			default:
				close(release)
			}
		})
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("runner A did not reach position 5")
		}
		holders := h.lockHolders(sub)
		if len(holders) != 1 {
			t.Fatalf("lock holders of %s: %v, want one", sub, holders)
		}
		var ok bool
		if err := h.pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, holders[0]).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend(%d) = %v, %v", holders[0], ok, err)
		}
		annalstest.WaitFor(t, 5*time.Second, func() bool { return len(h.lockHolders(sub)) == 0 })
		if cp, n := h.checkpoint(sub), h.seenCount(); cp != 0 || n != 0 {
			t.Fatalf("after the loss: checkpoint %d, %d events seen; want 0, 0", cp, n)
		}
		return h, a, release
	}

	// Runner B takes the lock while A still holds its batch, then A is
	// released: A's batch (1..4 already written in its transaction) is not
	// committed, and B applies every event once.
	t.Run("AnotherRunnerTakesOver", func(t *testing.T) {
		t.Parallel()
		h, a, release := setup(t)
		b := &seenProjection{name: sub, writer: "B"}
		rb := h.newRunner(testConfig(time.Second), nil, b)
		h.run(rb)
		h.waitCaughtUp(10*time.Second, sub)

		close(release)
		annalstest.WaitFor(t, 10*time.Second, func() bool { return a.errs.Load() > 0 }) // A's next statement failed
		more := h.appendEvents(5, 3)
		annalstest.WaitFor(t, 10*time.Second, func() bool { return h.checkpoint(sub) == more })
		h.checkSeenIsLog(sub)
		if n := h.query(`SELECT count(*) FROM seen WHERE writer <> 'B'`); n != 0 {
			t.Fatalf("%d events in the read model were written by the runner that lost its lock", n)
		}
		var epoch int64
		var owner string
		if err := h.pool.QueryRow(context.Background(), `SELECT epoch, owner FROM annals.checkpoints WHERE subscriber_id = $1`, sub).Scan(&epoch, &owner); err != nil {
			t.Fatal(err)
		}
		if epoch != 2 || owner != rb.InstanceID() {
			t.Fatalf("checkpoint epoch %d, owner %q; want 2, %q (B's claim, nobody since)", epoch, owner, rb.InstanceID())
		}
		a.checkNoDupes(t)
		b.checkNoDupes(t)
	})

	// Nobody else runs: A notices the loss when released, stands by, takes
	// the lock again with a new epoch and applies the batch exactly once.
	t.Run("SameRunnerReacquires", func(t *testing.T) {
		t.Parallel()
		h, a, release := setup(t)
		close(release)
		h.waitCaughtUp(15*time.Second, sub)
		h.checkSeenIsLog(sub)
		if e := h.epoch(sub); e != 2 {
			t.Fatalf("epoch %d, want 2: one new claim after the loss", e)
		}
		a.checkNoDupes(t)
	})
}

// TestCheckpointFencing: checkpoint.Store refuses a stale epoch, and an
// operator's Store.Set while a runner leads fences the runner off, which then
// claims again and goes on from the operator's position.
func TestCheckpointFencing(t *testing.T) {
	t.Parallel()

	t.Run("StaleEpoch", func(t *testing.T) {
		t.Parallel()
		h := newLiveHarness(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		store, err := checkpoint.New("")
		if err != nil {
			t.Fatal(err)
		}
		load := func() checkpoint.Checkpoint {
			t.Helper()
			c, err := store.Load(ctx, h.pool, "sub", 0)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		want := func(c checkpoint.Checkpoint, pos, epoch int64, owner string) {
			t.Helper()
			if c.Position != pos || c.Epoch != epoch || c.Owner != owner {
				t.Fatalf("checkpoint at %d, epoch %d, owner %q; want %d, %d, %q", c.Position, c.Epoch, c.Owner, pos, epoch, owner)
			}
		}
		mustCommit := func(epoch, pos int64) {
			t.Helper()
			if err := store.Commit(ctx, h.pool, "sub", 0, epoch, pos); err != nil {
				t.Fatalf("Commit(epoch %d, %d): %v", epoch, pos, err)
			}
		}
		fenced := func(epoch, pos int64) {
			t.Helper()
			if err := store.Commit(ctx, h.pool, "sub", 0, epoch, pos); !errors.Is(err, checkpoint.ErrFenced) {
				t.Fatalf("Commit(epoch %d, %d) = %v, want ErrFenced", epoch, pos, err)
			}
		}

		if _, err := store.Load(ctx, h.pool, "sub", 0); !errors.Is(err, checkpoint.ErrNotFound) {
			t.Fatalf("Load before any claim: %v, want ErrNotFound", err)
		}
		c, err := store.Claim(ctx, h.pool, "sub", 0, "one")
		if err != nil {
			t.Fatal(err)
		}
		want(c, 0, 1, "one")
		mustCommit(1, 5)
		c, err = store.Claim(ctx, h.pool, "sub", 0, "two")
		if err != nil {
			t.Fatal(err)
		}
		want(c, 5, 2, "two")
		fenced(1, 9) // "one" has not noticed that "two" leads
		want(load(), 5, 2, "two")
		mustCommit(2, 3) // never backwards
		want(load(), 5, 2, "two")
		mustCommit(2, 9)
		want(load(), 9, 2, "two")

		// A stale leader's read-model writes roll back with its commit.
		err = pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO side (note) VALUES ('stale leader')`); err != nil {
				return err
			}
			return store.Commit(ctx, tx, "sub", 0, 1, 20)
		})
		if !errors.Is(err, checkpoint.ErrFenced) {
			t.Fatalf("stale commit in a transaction: %v, want ErrFenced", err)
		}
		if n := h.query(`SELECT count(*) FROM side`); n != 0 {
			t.Fatalf("the stale leader's write is in the table")
		}

		c, err = store.Set(ctx, h.pool, "sub", 0, 4) // an operator rewinds
		if err != nil {
			t.Fatal(err)
		}
		want(c, 4, 3, "")
		fenced(2, 10) // the leader must not overwrite the operator's position
		want(load(), 4, 3, "")

		if err := store.Commit(ctx, h.pool, "nobody", 0, 1, 1); !errors.Is(err, checkpoint.ErrFenced) {
			t.Fatalf("Commit for an unknown subscriber: %v, want ErrFenced", err)
		}
		for _, err := range []error{
			store.Commit(ctx, h.pool, "sub", 0, 3, -1),
			store.Commit(ctx, h.pool, "", 0, 3, 1),
			store.Commit(ctx, h.pool, "sub", -1, 3, 1),
		} {
			if !errors.Is(err, checkpoint.ErrInvalid) {
				t.Fatalf("bad Commit: %v, want ErrInvalid", err)
			}
		}
		want(load(), 4, 3, "")
	})

	// setup runs a leading runner over 10 events, caught up. p counts
	// applications per event in "applied" (re-application allowed).
	setup := func(t *testing.T) (*liveHarness, *projection.Runner, *checkpoint.Store) {
		t.Helper()
		h := newLiveHarness(t)
		if _, err := h.pool.Exec(context.Background(), `CREATE TABLE applied (global_sequence bigint PRIMARY KEY, n int NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		h.appendEvents(10, 3)
		r := h.newRunner(testConfig(200*time.Millisecond), nil, countingProjection{})
		h.run(r)
		h.waitCaughtUp(10*time.Second, "counting")
		if e := h.epoch("counting"); e != 1 {
			t.Fatalf("epoch %d, want 1", e)
		}
		store, err := checkpoint.New("")
		if err != nil {
			t.Fatal(err)
		}
		return h, r, store
	}
	set := func(h *liveHarness, store *checkpoint.Store, pos int64) {
		h.t.Helper()
		if _, err := store.Set(context.Background(), h.pool, "counting", 0, pos); err != nil {
			h.t.Fatal(err)
		}
	}
	// applications returns the number of applications of positions 1..n.
	applications := func(h *liveHarness, n int64) []int64 {
		h.t.Helper()
		rows, err := h.pool.Query(context.Background(), `SELECT coalesce(a.n, 0) FROM generate_series(1, $1::bigint) g LEFT JOIN applied a ON a.global_sequence = g ORDER BY g`, n)
		if err != nil {
			h.t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			h.t.Fatal(err)
		}
		return out
	}
	checkReclaimed := func(h *liveHarness, r *projection.Runner) {
		h.t.Helper()
		var epoch int64
		var owner *string
		if err := h.pool.QueryRow(context.Background(), `SELECT epoch, owner FROM annals.checkpoints WHERE subscriber_id = 'counting'`).Scan(&epoch, &owner); err != nil {
			h.t.Fatal(err)
		}
		if epoch != 3 || owner == nil || *owner != r.InstanceID() {
			h.t.Fatalf("epoch %d, owner %v; want 3 and the runner (claimed again after the operator's set)", epoch, owner)
		}
	}

	// Moving the checkpoint forward skips events: the leader's batch of
	// 11..20 is fenced off and rolled back; it claims again at 15.
	t.Run("OperatorSkipsForward", func(t *testing.T) {
		t.Parallel()
		h, r, store := setup(t)
		set(h, store, 15)
		head := h.appendEvents(10, 3)
		annalstest.WaitFor(t, 10*time.Second, func() bool { return h.checkpoint("counting") == head })
		got := applications(h, head)
		for i, n := range got {
			pos := int64(i + 1)
			want := int64(1)
			if pos > 10 && pos <= 15 {
				want = 0
			}
			if n != want {
				t.Fatalf("position %d applied %d times, want %d (all: %v)", pos, n, want, got)
			}
		}
		checkReclaimed(h, r)
	})

	// Moving it back replays: once the leader next commits (event 11), it
	// is fenced off, claims again at 4 and applies 5..11.
	t.Run("OperatorRewinds", func(t *testing.T) {
		t.Parallel()
		h, r, store := setup(t)
		set(h, store, 4)
		head := h.appendEvents(1, 1)
		annalstest.WaitFor(t, 10*time.Second, func() bool {
			a := applications(h, head)
			return a[4] == 2 && a[head-1] >= 1 && h.checkpoint("counting") == head
		})
		got := applications(h, head)
		for i, n := range got {
			pos := int64(i + 1)
			want := int64(1)
			if pos > 4 && pos <= 10 {
				want = 2
			}
			if n != want {
				t.Fatalf("position %d applied %d times, want %d (all: %v)", pos, n, want, got)
			}
		}
		checkReclaimed(h, r)
	})

	// The same without a new event: a leader that is idle must also notice
	// the operator's set (within a few poll intervals) and replay 5..10.
	t.Run("OperatorRewindsIdleLeader", func(t *testing.T) {
		t.Parallel()
		h, r, store := setup(t)
		set(h, store, 4)
		annalstest.WaitForErr(t, 5*time.Second, func() error {
			if a, cp, e := applications(h, 10), h.checkpoint("counting"), h.epoch("counting"); a[9] != 2 || cp != 10 {
				return errors.Newf("applications %v, checkpoint %d, epoch %d (2: the operator's, not claimed since)", a, cp, e)
			}
			return nil
		})
		checkReclaimed(h, r)
	})
}

// countingProjection counts the applications of each event in "applied".
type countingProjection struct{}

func (countingProjection) Name() string { return "counting" }

func (countingProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1, 1) ON CONFLICT (global_sequence) DO UPDATE SET n = applied.n + 1`, e.GlobalSequence)
	return err
}
