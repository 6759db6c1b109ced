package catchup

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/lockkey"
)

// behindRecorder records, for each batch, whether its commit may skip the
// WAL flush (the lease's behind flag while Process runs).
type behindRecorder struct {
	behind []bool
	last   []int64
}

func (r *behindRecorder) Start(context.Context, *Lease) error     { return nil }
func (r *behindRecorder) Redeliver(context.Context, *Lease) error { return nil }
func (r *behindRecorder) Idle(context.Context, *Lease) error      { return nil }
func (r *behindRecorder) End(context.Context, *Lease) error       { return nil }
func (r *behindRecorder) Process(_ context.Context, lease *Lease, b Batch) (int64, error) {
	r.behind = append(r.behind, lease.behind)
	r.last = append(r.last, b.Through)
	return b.Through, nil
}

// A batch read while its partition is behind the head (and its target)
// commits without waiting for its WAL flush, the batch that reaches the
// head or the target waits (so a catch-up ends durable), SyncCommits turns
// it off, and a transaction that appended events always waits.
func TestAsyncCommitWhileBehind(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		evs := make([]eventstore.EventData, 100)
		for j := range evs {
			evs[j] = eventstore.EventData{Type: "t.x", Data: map[string]int{"i": i*100 + j}}
		}
		if _, err := store.Append(ctx, fmt.Sprintf("s-%d", i), eventstore.NoStream, evs...); err != nil {
			t.Fatal(err)
		}
	}
	e, err := NewEngine(db.Pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A CatchUp to a target below the head (a rebuild while appends go on)
	// ends durable too: its last batch is not behind its target.
	{
		r := &behindRecorder{}
		sub := &Subscription{Name: "behind-target", BatchSize: 100, Processor: r}
		if err := e.CatchUp(ctx, sub, 550); err != nil {
			t.Fatal(err)
		}
		if len(r.behind) != 6 || r.last[5] != 550 {
			t.Fatalf("catch-up to 550: batches through %v", r.last)
		}
		for i, b := range r.behind {
			if want := i < 5; b != want {
				t.Fatalf("catch-up to 550: batch %d (through %d) behind = %v, want %v", i, r.last[i], b, want)
			}
		}
	}
	for _, sync := range []bool{false, true} {
		r := &behindRecorder{}
		sub := &Subscription{Name: fmt.Sprintf("behind-%v", sync), BatchSize: 100, Processor: r, SyncCommits: sync}
		if err := e.CatchUp(ctx, sub, 1000); err != nil {
			t.Fatal(err)
		}
		if len(r.behind) != 10 {
			t.Fatalf("SyncCommits %v: %d batches, want 10 (through %v)", sync, len(r.behind), r.last)
		}
		for i, b := range r.behind {
			want := !sync && i < 9
			if b != want {
				t.Fatalf("SyncCommits %v: batch %d (through %d) behind = %v, want %v", sync, i, r.last[i], b, want)
			}
		}
	}

	// The statement queued before COMMIT: off, unless the transaction
	// appended an event, in itself or in a subtransaction. Another
	// transaction's append (the newest event before this one) does not
	// count.
	if _, err := store.Append(ctx, "other", eventstore.Any, eventstore.EventData{Type: "t.x", Data: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	setting := func(appendFirst, savepoint bool) string {
		t.Helper()
		var got string
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
				return err
			}
			if appendFirst {
				q := tx
				if savepoint {
					sp, err := tx.Begin(ctx)
					if err != nil {
						return err
					}
					defer func() { _ = sp.Commit(ctx) }()
					q = sp
				}
				if _, err := store.AppendTx(ctx, q, "appended", eventstore.Any, eventstore.EventData{Type: "t.x", Data: map[string]int{}}); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, e.q["AsyncCommit"]); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&got)
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := setting(false, false); got != "off" {
		t.Fatalf("a batch transaction that appended nothing commits with synchronous_commit %q, want off", got)
	}
	if got := setting(true, false); got != "on" {
		t.Fatalf("a batch transaction that appended an event commits with synchronous_commit %q, want on", got)
	}
	if got := setting(true, true); got != "on" {
		t.Fatalf("a batch transaction that appended an event under a savepoint commits with synchronous_commit %q, want on", got)
	}
}

// CommitFencedHeld moves the checkpoint only while some session holds the
// partition's lock and the epoch is the lease's: with the lock free (the
// leader's lock session ended, nobody took over yet) it commits nothing;
// held by another session with the epoch unchanged it commits (that
// session has not claimed: its claim will read this commit); with the
// epoch moved on it commits nothing.
func TestCommitFencedHeldNeedsTheLockHeld(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	e, err := NewEngine(db.Pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch) VALUES ('held', 0, 10, 7)`); err != nil {
		t.Fatal(err)
	}
	k1, k2 := lockkey.Pair(LockKey("annals", "held", 0))
	position := func() (p int64) {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, `SELECT position FROM annals.checkpoints WHERE subscriber_id = 'held'`).Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// known: where the leader knows the checkpoint (10, unless said).
	commitFrom := func(epoch, known, pos int64) error {
		t.Helper()
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, e.q["CommitFencedHeld"], "held", 0, epoch, pos, k1, k2, known)
			return err
		})
	}
	commit := func(epoch, pos int64) error { return commitFrom(epoch, position(), pos) }
	if err := commit(7, 20); err == nil || !strings.Contains(err.Error(), "checkpoint fenced") {
		t.Fatalf("commit with the lock free: %v, want fenced", err)
	}
	if err := commitFrom(7, 5, 20); err == nil || !strings.Contains(err.Error(), "checkpoint fenced") {
		t.Fatalf("commit with the lock free, the checkpoint past where the leader knows it: %v, want fenced", err)
	}
	holder, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1::int4, $2::int4)`, k1, k2); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = holder.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`) }()
	if err := commit(7, 30); err != nil {
		t.Fatalf("commit with the lock held and the epoch unchanged: %v", err)
	}
	if p := position(); p != 30 {
		t.Fatalf("position %d, want 30", p)
	}
	// A commit of this leader's whose answer was lost landed (the
	// checkpoint is at 30, the leader knows it at 10): moved, not fenced.
	if err := commitFrom(7, 10, 35); err == nil || !strings.Contains(err.Error(), "checkpoint moved past 10") {
		t.Fatalf("commit with the checkpoint past where the leader knows it: %v, want moved", err)
	}
	if err := commit(6, 40); err == nil || !strings.Contains(err.Error(), "checkpoint fenced") {
		t.Fatalf("commit with an old epoch: %v, want fenced", err)
	}
	if p := position(); p != 30 {
		t.Fatalf("position %d after fenced commits, want 30", p)
	}

	// CommitConn with begin (an observer's checkpoint write) rolls back the
	// transaction it began when the write is fenced: the connection goes
	// back idle.
	lease := &Lease{Subscriber: "held", Partition: 0, Epoch: 6, shared: &sharedLock{key: LockKey("annals", "held", 0)},
		commitSQL: e.q["CommitFenced"], commitHeldSQL: e.q["CommitFencedHeld"]}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := lease.CommitConn(ctx, conn.Conn(), true, 50); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("CommitConn with an old epoch: %v, want checkpoint.ErrFenced", err)
	}
	if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
		t.Fatalf("after a fenced CommitConn with begin the connection's transaction status is %q, want idle", st)
	}
	if p := position(); p != 30 {
		t.Fatalf("position %d after the fenced CommitConn, want 30", p)
	}
	// In the epoch, with the checkpoint past where the lease knows it:
	// checkpoint.ErrMoved, rolled back the same way.
	lease.Epoch = 7
	lease.known.Store(10)
	if err := lease.CommitConn(ctx, conn.Conn(), true, 50); !errors.Is(err, checkpoint.ErrMoved) || errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("CommitConn with the checkpoint moved past what the lease knows: %v, want checkpoint.ErrMoved", err)
	}
	if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
		t.Fatalf("after a moved CommitConn with begin the connection's transaction status is %q, want idle", st)
	}
	lease.known.Store(30)
	if err := lease.CommitConn(ctx, conn.Conn(), true, 50); err != nil {
		t.Fatalf("CommitConn knowing the checkpoint: %v", err)
	}
	if p := position(); p != 50 || lease.known.Load() != 50 {
		t.Fatalf("position %d, the lease knows %d; want 50, 50", p, lease.known.Load())
	}
}
