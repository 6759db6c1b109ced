package projection_test

import (
	"context"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// resetCut is a resettable projection (a row per event in rb_applied)
// whose Reset, once arm is set, stops its backend right before the reset's
// COMMIT is sent and cuts its connection right after.
type resetCut struct {
	cp     *annalstest.CutPool
	arm    atomic.Bool
	frozen atomic.Int32
	t      *testing.T
}

func (*resetCut) Name() string { return "rbcut" }

func (*resetCut) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO rb_applied (position) VALUES ($1)`, e.GlobalSequence)
	return err
}

func (p *resetCut) Reset(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `DELETE FROM rb_applied`); err != nil {
		return err
	}
	if !p.arm.CompareAndSwap(true, false) {
		return nil
	}
	c, err := p.cp.Of(ctx, tx)
	if err != nil {
		return err
	}
	pid := tx.Conn().PgConn().PID()
	c.StopServerAndCutAfter(p.t, annalstest.HasCommit, pid, func() { p.frozen.Store(int32(pid)) })
	return nil
}

// TestRebuildResetCommitLostBeforeTheServerCommits: the COMMIT of a
// rebuild's reset (the read model emptied, every checkpoint at 0; with
// NewLayout, the new layout recorded too) loses its answer, and the server
// runs it only after Rebuild has returned (the backend stopped before it
// got the COMMIT). Rebuild must not say that nothing changed: the reset
// lands, and the live instances replay from 0 into the emptied read model.
// It said "reset (nothing changed)", or "change the partition layout
// (nothing changed)".
func TestRebuildResetCommitLostBeforeTheServerCommits(t *testing.T) {
	t.Parallel()
	for _, relayout := range []bool{false, true} {
		name := "Reset"
		if relayout {
			name = "NewLayout"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rebuildCommitLost(t, relayout)
		})
	}
}

func rebuildCommitLost(t *testing.T, relayout bool) {
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE rb_applied (position bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := store.Append(ctx, "rb-1", eventstore.Any, eventstore.EventData{Type: "rb.happened", Data: map[string]int{"n": 1}}); err != nil {
			t.Fatal(err)
		}
	}
	cp := annalstest.NewCutPool(t, db)
	p := &resetCut{cp: cp, t: t}
	runner, err := projection.NewRunner(cp.Pool, &projection.Config{RetryBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.Register(p, nil); err != nil {
		t.Fatal(err)
	}
	if err := runner.Rebuild(ctx, "rbcut", nil); err != nil {
		t.Fatal(err)
	}
	// rows in the read model, the highest checkpoint, the recorded layout
	state := func() (rows int, pos int64, parts int) {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM rb_applied`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if err := db.Pool.QueryRow(ctx, `SELECT max(position) FROM annals.checkpoints WHERE subscriber_id = 'rbcut'`).Scan(&pos); err != nil {
			t.Fatal(err)
		}
		if err := db.Pool.QueryRow(ctx, `SELECT partitions FROM annals.subscriber_layouts WHERE subscriber_id = 'rbcut'`).Scan(&parts); err != nil {
			t.Fatal(err)
		}
		return rows, pos, parts
	}
	if rows, pos, parts := state(); rows != 3 || pos != 3 || parts != 1 {
		t.Fatalf("after the first rebuild: %d rows, checkpoint %d, %d partitions; want 3, 3, 1", rows, pos, parts)
	}

	var opts *projection.RebuildOptions
	wantParts, step := 1, "reset"
	if relayout {
		// An instance of the new layout, two partitions.
		p = &resetCut{cp: cp, t: t}
		if runner, err = projection.NewRunner(cp.Pool, &projection.Config{RetryBackoff: 50 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if err := runner.Register(p, &projection.Options{Partitions: 2}); err != nil {
			t.Fatal(err)
		}
		opts, wantParts, step = &projection.RebuildOptions{NewLayout: true}, 2, "change the partition layout"
	}
	p.arm.Store(true)
	err = runner.Rebuild(ctx, "rbcut", opts)
	pid := p.frozen.Swap(0)
	if pid == 0 {
		t.Fatalf("the reset's backend was not stopped (is the test cluster on this machine?); Rebuild: %v", err)
	}
	rows, pos, parts := state() // as the rebuild returns: the reset not landed yet
	_ = syscall.Kill(int(pid), syscall.SIGCONT)
	if err == nil {
		t.Fatal("Rebuild whose reset's COMMIT got no answer returned nil")
	}
	if rows != 3 || pos != 3 || parts != 1 {
		t.Fatalf("as Rebuild returned, the reset had landed already (%d rows, checkpoint %d, %d partitions): the backend was not stopped in time", rows, pos, parts)
	}
	if msg := err.Error(); strings.Contains(msg, "nothing changed") || !strings.Contains(msg, step+": its COMMIT got no answer, and it may have committed") {
		t.Fatalf("Rebuild whose reset's COMMIT got no answer: %v; want it to say the %s may have committed, not that nothing changed", err, step)
	}
	// The stopped backend runs the COMMIT once it goes on; its session
	// then ends, the client being gone.
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		var n int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n)
		return err == nil && n == 0
	})
	if rows, pos, parts := state(); rows != 0 || pos != 0 || parts != wantParts {
		t.Fatalf("after the reset's late COMMIT: %d rows, checkpoint %d, %d partitions; want 0, 0, %d (the reset landed)", rows, pos, parts, wantParts)
	}
}
