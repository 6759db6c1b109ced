package projection_test

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// lateCutProjection records each application of an event in applied (no
// key: an event applied twice has two rows) and commits after every event
// (a CommitCutter, as a saga whose events append effects). The first time
// it handles stop, it stops its transaction's backend right before that
// transaction's checkpoint move and COMMIT are sent, and cuts the
// connection right after: the runner sees the commit fail, while the
// server holds its bytes and runs them once the test lets the backend go on
// (frozen holds the backend's pid meanwhile).
type lateCutProjection struct {
	t      *testing.T
	cp     *annalstest.CutPool
	stop   int64
	armed  atomic.Bool
	frozen atomic.Int32
}

func (*lateCutProjection) Name() string { return "latecut" }

func (*lateCutProjection) CommitAfter(eventstore.Event) bool { return true }

func (p *lateCutProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if _, err := tx.Exec(ctx, `INSERT INTO applied (position) VALUES ($1)`, e.GlobalSequence); err != nil {
		return err
	}
	if e.GlobalSequence != p.stop || !p.armed.CompareAndSwap(false, true) {
		return nil
	}
	c, err := p.cp.Of(ctx, tx)
	if err != nil {
		p.t.Error(err)
		return err
	}
	pid := tx.Conn().PgConn().PID()
	c.StopServerAndCutAfter(p.t, annalstest.HasExecute, pid, func() { p.frozen.Store(int32(pid)) })
	return nil
}

// TestCommitCutLostCommitLandsAfterTheRetry: a CommitCutter projection
// commits each event of a batch in a transaction of its own, so the lease
// knows the checkpoint past the batch's start when the second of them (at
// event 2) loses its commit's answer. The server runs that COMMIT only
// after the runner has retried from event 1 on another connection and
// committed events 2 and 3 again; both transactions carry the
// leadership's epoch, and the late one must fail on the checkpoint being
// past where its lease knew it (1), not apply event 2 a second time.
func TestCommitCutLostCommitLandsAfterTheRetry(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE applied (position bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]eventstore.EventData, 3)
	for i := range evs {
		evs[i] = eventstore.EventData{Type: "latecut.happened", Data: map[string]int{"n": i + 1}}
	}
	if _, err := store.Append(ctx, "latecut-1", eventstore.NoStream, evs...); err != nil {
		t.Fatal(err)
	}
	cp := annalstest.NewCutPool(t, db)
	p := &lateCutProjection{t: t, cp: cp, stop: 2}
	t.Cleanup(func() {
		if pid := p.frozen.Load(); pid != 0 {
			_ = syscall.Kill(int(pid), syscall.SIGCONT)
		}
	})
	runner, err := projection.NewRunner(cp.Pool, &projection.Config{RetryBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.Register(p, &projection.Options{Retry: &projection.RetryPolicy{MaxRetries: -1}}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	position := func() (n int64) {
		_ = db.Pool.QueryRow(ctx, `SELECT position FROM annals.checkpoints WHERE subscriber_id = 'latecut'`).Scan(&n)
		return n
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool { return p.frozen.Load() != 0 })
	// The retry commits events 2 and 3 while the first attempt's commit of
	// event 2 waits, unsent to the server, in its stopped backend's socket.
	annalstest.WaitFor(t, 20*time.Second, func() bool { return position() == 3 })
	pid := p.frozen.Load()
	if err := syscall.Kill(int(pid), syscall.SIGCONT); err != nil {
		t.Fatalf("continue backend %d: %v", pid, err)
	}
	// It runs its checkpoint move and COMMIT (or fails them), then ends: its
	// client is gone.
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		var n int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n)
		return err == nil && n == 0
	})
	rows, err := db.Pool.Query(ctx, `SELECT position, count(*) FROM applied GROUP BY position ORDER BY position`)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[int64]int{}
	var at int64
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&at, &n}, func() error { counts[at] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(counts) != 3 || counts[1] != 1 || counts[2] != 1 || counts[3] != 1 {
		t.Fatalf("applied %v (position: times), want each of 1..3 once", counts)
	}
	if got := position(); got != 3 {
		t.Fatalf("checkpoint at %d, want 3", got)
	}
}
