package catchup_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
)

// landedProcessor applies each batch (a row per event in applied, no key:
// an event applied twice has two rows) with its checkpoint, through
// Lease.CommitTx. Its first batch plays a commit whose answer was lost and
// that the server runs late: an earlier attempt at the same batch, on
// another session, has moved the checkpoint and waits for its COMMIT; this
// attempt's checkpoint move waits for its row lock, and that COMMIT then
// lands.
type landedProcessor struct {
	pool     *pgxpool.Pool
	sub      string
	first    atomic.Bool
	firstErr atomic.Pointer[error]
}

func (p *landedProcessor) Start(context.Context, *catchup.Lease) error     { return nil }
func (p *landedProcessor) Redeliver(context.Context, *catchup.Lease) error { return nil }
func (p *landedProcessor) Idle(context.Context, *catchup.Lease) error      { return nil }
func (p *landedProcessor) End(context.Context, *catchup.Lease) error       { return nil }

func (p *landedProcessor) apply(ctx context.Context, lease *catchup.Lease, b catchup.Batch) error {
	return lease.Do(ctx, func(conn *pgx.Conn) error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO applied SELECT g FROM generate_series($1::bigint + 1, $2::bigint) g`, b.After, b.Through); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := lease.CommitTx(ctx, tx, b.Through); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		return nil
	})
}

func (p *landedProcessor) Process(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (int64, error) {
	if !p.first.CompareAndSwap(false, true) {
		return b.Through, p.apply(ctx, lease, b)
	}
	err := p.lateCommit(ctx, lease, b)
	p.firstErr.Store(&err)
	return b.After, err
}

// lateCommit applies b while the earlier attempt's transaction, which has
// applied it and moved the checkpoint, waits for its COMMIT, and commits
// that once b's checkpoint move waits for it.
func (p *landedProcessor) lateCommit(ctx context.Context, lease *catchup.Lease, b catchup.Batch) error {
	earlier, err := p.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = earlier.Rollback(ctx) }()
	if _, err := earlier.Exec(ctx, `INSERT INTO applied SELECT g FROM generate_series($1::bigint + 1, $2::bigint) g`, b.After, b.Through); err != nil {
		return err
	}
	if _, err := earlier.Exec(ctx, `UPDATE annals.checkpoints SET position = $3 WHERE subscriber_id = $1 AND partition = $2`, p.sub, lease.Partition, b.Through); err != nil {
		return err
	}
	applied := make(chan error, 1)
	go func() { applied <- p.apply(ctx, lease, b) }()
	// Waits for the earlier transaction's backend, not any in the cluster:
	// the other tests' databases share it.
	earlierPID := int32(earlier.Conn().PgConn().PID())
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int4 = ANY(pg_blocking_pids(pid))`, earlierPID).Scan(&waiting); err != nil {
			return err
		}
		if waiting > 0 {
			break
		}
		select {
		case err := <-applied:
			return errors.Newf("the second attempt did not wait for the first one's row lock: it returned %v", err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("the second attempt's checkpoint move never waited for the first one's")
		}
	}
	if err := earlier.Commit(ctx); err != nil {
		return err
	}
	return <-applied
}

// TestCommitAfterALostCommitLanded: a batch is applied again after a
// commit whose answer was lost, and that commit lands on the server while
// the new attempt's transaction is under way (its backend ran it late). Both
// transactions carry the leadership's epoch; the new attempt's checkpoint
// move, which waited for the landed one's row lock, must fail with
// checkpoint.ErrMoved and roll back, and the engine must go on from the
// checkpoint: every event applied once. It held only the epoch, and both
// committed (archive's TestLifecycleChaos once applied a batch twice so).
// On both kinds of lease: a Run's (its lock on the engine's lock session,
// CommitFencedHeld) and a TakeOver's (CommitFenced).
func TestCommitAfterALostCommitLanded(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"run", "takeover"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := annalstest.NewDB(t, nil)
			ctx := t.Context()
			if _, err := db.Pool.Exec(ctx, `CREATE TABLE applied (position bigint NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			store, err := eventstore.New(db.Pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 5 {
				evs := make([]eventstore.EventData, 10)
				for j := range evs {
					evs[j] = eventstore.EventData{Type: "t.x", Data: map[string]int{"i": i*10 + j}}
				}
				if _, err := store.Append(ctx, fmt.Sprintf("s-%d", i), eventstore.NoStream, evs...); err != nil {
					t.Fatal(err)
				}
			}
			e, err := catchup.NewEngine(db.Pool, nil, &catchup.Config{RetryBackoff: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			p := &landedProcessor{pool: db.Pool, sub: "landed-" + mode}
			sub := &catchup.Subscription{Name: p.sub, BatchSize: 10, Processor: p}
			switch mode {
			case "run":
				rctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- e.Run(rctx, sub) }()
				annalstest.WaitFor(t, 20*time.Second, func() bool {
					var n int64
					err := db.Pool.QueryRow(ctx, `SELECT position FROM annals.checkpoints WHERE subscriber_id = $1`, p.sub).Scan(&n)
					return err == nil && n == 50
				})
				cancel()
				if err := <-done; err != nil {
					t.Fatalf("Run: %v", err)
				}
			case "takeover":
				lease, err := e.TakeOver(ctx, sub, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				err = e.Drive(ctx, sub, lease, 50)
				e.Release(ctx, lease)
				if err != nil {
					t.Fatalf("Drive: %v", err)
				}
			}
			if got := p.firstErr.Load(); got == nil {
				t.Error("the first batch was not processed")
			} else if !errors.Is(*got, checkpoint.ErrMoved) {
				t.Errorf("the second attempt's commit returned %v, want checkpoint.ErrMoved", *got)
			}
			var rows, positions, lo, hi int64
			if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT position), min(position), max(position) FROM applied`).Scan(&rows, &positions, &lo, &hi); err != nil {
				t.Fatal(err)
			}
			if rows != 50 || positions != 50 || lo != 1 || hi != 50 {
				t.Fatalf("applied %d rows for %d positions (%d..%d), want each of 1..50 once", rows, positions, lo, hi)
			}
		})
	}
}
