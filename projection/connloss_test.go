package projection_test

// A projection's connection failing at the worst moments: right after the
// batch's COMMIT was sent (the commit lands, its answer is lost), and under
// a handler (the transaction is gone with the session). Neither may apply
// an event twice, and neither is the event's failure.

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

// cutProjection records each application of an event in applied (no key:
// an event applied twice has two rows) and, on its first call, does what
// cut says to its connection (cut reports whether it cut at once; pid is
// the connection's backend).
type cutProjection struct {
	t     *testing.T
	cp    *annalstest.CutPool
	cut   func(c *annalstest.CutConn, pid uint32) bool
	calls atomic.Int64
}

func (p *cutProjection) Name() string { return "cut" }

func (p *cutProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if p.calls.Add(1) == 1 {
		c, err := p.cp.Of(ctx, tx)
		if err != nil {
			p.t.Error(err)
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO applied (position) VALUES ($1)`, e.GlobalSequence); err != nil {
			return err
		}
		if p.cut(c, tx.Conn().PgConn().PID()) {
			// Cut at once: this statement fails, and the handler returns
			// its error, as a handler does.
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		}
		return nil
	}
	_, err := tx.Exec(ctx, `INSERT INTO applied (position) VALUES ($1)`, e.GlobalSequence)
	return err
}

func runCut(t *testing.T, cut func(c *annalstest.CutConn, pid uint32) bool) (*annalstest.DB, *cutProjection) {
	t.Helper()
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE applied (position bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	cp := annalstest.NewCutPool(t, db)
	p := &cutProjection{t: t, cp: cp, cut: cut}
	runner, err := projection.NewRunner(cp.Pool, &projection.Config{RetryBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// No retries: an attempt counted against the event dead-letters it.
	if err := runner.Register(p, &projection.Options{Retry: &projection.RetryPolicy{MaxRetries: -1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "cut-1", eventstore.NoStream, eventstore.EventData{Type: "cut.happened", Data: map[string]int{"n": 1}}); err != nil {
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
	// The first event, then a second appended once the first attempt is
	// over: the runner has caught up past both only when it holds 2.
	annalstest.WaitFor(t, 20*time.Second, func() bool { return p.calls.Load() >= 1 })
	if _, err := store.Append(ctx, "cut-2", eventstore.NoStream, eventstore.EventData{Type: "cut.happened", Data: map[string]int{"n": 2}}); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		var n int64
		err := db.Pool.QueryRow(ctx, `SELECT position FROM annals.checkpoints WHERE subscriber_id = 'cut'`).Scan(&n)
		return err == nil && n >= 2
	})
	return db, p
}

// appliedCounts returns how often each position was applied, and the
// subscriber's dead letters.
func appliedCounts(t *testing.T, db *annalstest.DB) (map[int64]int, int) {
	t.Helper()
	ctx := t.Context()
	rows, err := db.Pool.Query(ctx, `SELECT position, count(*) FROM applied GROUP BY position`)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[int64]int{}
	var pos int64
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&pos, &n}, func() error { counts[pos] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	var dead int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.dead_letters WHERE subscriber_id = 'cut'`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	return counts, dead
}

// The connection is cut right after the batch's COMMIT is sent: the batch
// commits, and the runner gets an error instead of its answer. It must not
// apply the batch again (its next read finds the checkpoint past its
// cursor and goes on from there).
func TestCommitAnswerLost(t *testing.T) {
	t.Parallel()
	db, p := runCut(t, func(c *annalstest.CutConn, _ uint32) bool { c.CutAfter(annalstest.HasExecute); return false })
	counts, dead := appliedCounts(t, db)
	if counts[1] != 1 || counts[2] != 1 || dead != 0 {
		t.Fatalf("applied %v (position: times), %d dead letters, %d handler calls; want each position once and no dead letter",
			counts, dead, p.calls.Load())
	}
}

// TestCommitAnswerLostBeforeTheServerCommits: as TestCommitAnswerLost, with
// the server running the batch's commit only after the runner has seen its
// connection cut (the backend stopped for half a second before the commit
// is sent, as a loaded machine does now and then): the runner's next read
// still finds the checkpoint where it was, and applies the batch again on
// another connection while the first one's COMMIT waits in its backend.
// Both commits passed the epoch fence, and the batch was applied twice
// (archive's TestLifecycleChaos saw it once, in make test); a commit now
// also needs the checkpoint not to be past where its leader knows it, so
// the later of the two fails and rolls back. The backend is the test
// cluster's, on this machine (as the crash tests stop PostgreSQL's
// processes).
func TestCommitAnswerLostBeforeTheServerCommits(t *testing.T) {
	t.Parallel()
	var frozen atomic.Uint32
	db, p := runCut(t, func(c *annalstest.CutConn, pid uint32) bool {
		c.StopServerAndCutAfter(t, annalstest.HasExecute, pid, func() {
			frozen.Store(pid)
			time.AfterFunc(500*time.Millisecond, func() { _ = syscall.Kill(int(pid), syscall.SIGCONT) })
		})
		return false
	})
	pid := frozen.Load()
	if pid == 0 {
		t.Fatal("the batch's backend was not stopped (SIGSTOP): is the test cluster on this machine?")
	}
	// The stopped backend's commit runs (or fails) once it goes on; its
	// session then ends, the client being gone.
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		var n int
		err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&n)
		return err == nil && n == 0
	})
	counts, dead := appliedCounts(t, db)
	if counts[1] != 1 || counts[2] != 1 || dead != 0 {
		t.Fatalf("applied %v (position: times), %d dead letters, %d handler calls; want each position once and no dead letter",
			counts, dead, p.calls.Load())
	}
}

// The connection is cut under a handler: its transaction is gone, nothing
// of it applied. That is an outage, not the event's failure: no attempt is
// counted (with no retries allowed, one would dead-letter the event), and
// the event is applied once when the batch is retried.
func TestConnectionCutUnderHandler(t *testing.T) {
	t.Parallel()
	db, p := runCut(t, func(c *annalstest.CutConn, _ uint32) bool { c.CutNow(); return true })
	counts, dead := appliedCounts(t, db)
	if counts[1] != 1 || counts[2] != 1 || dead != 0 {
		t.Fatalf("applied %v (position: times), %d dead letters, %d handler calls; want each position once and no dead letter",
			counts, dead, p.calls.Load())
	}
	var failures int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM annals.failures WHERE subscriber_id = 'cut'`).Scan(&failures); err != nil {
		t.Fatal(err)
	}
	if failures != 0 {
		t.Fatalf("%d failed attempts recorded for a connection cut under the handler, want 0", failures)
	}
}
