package natsconsumer_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// keyed is a projection that writes a row per event, keyed by its
// position, as most read models are keyed (no ON CONFLICT: an event
// applied twice is a unique violation). hook, when set, is called after
// the row of the event at position at is written.
type keyed struct {
	at   int64
	hook func(ctx context.Context, tx pgx.Tx) error
}

func (keyed) Name() string { return "keyed" }

func (k keyed) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if _, err := tx.Exec(ctx, `INSERT INTO keyed (pos) VALUES ($1)`, e.GlobalSequence); err != nil {
		return err
	}
	if e.GlobalSequence == k.at && k.hook != nil {
		return k.hook(ctx, tx)
	}
	return nil
}

// TestRunProjectionCommitLandsLateUnderAKeyedHandler: RunProjection's
// COMMIT for event 4 loses its answer (the connection cut right after it
// was sent), and the server runs it only later (the backend stopped before
// it got it, as a loaded machine does now and then). RunProjection tries
// the event again; the projection, keyed by position, writes event 4's row
// again, which waits for the first attempt's, and fails with a unique
// violation once that commits. The retry must find the checkpoint at the
// event (the first attempt committed it) and go on: every event applied
// once. Before, the unique violation was the handler's failure, retried
// for ever before the checkpoint was looked at: the consumer was stuck at
// event 4 (so also after a lost answer whose COMMIT had landed at once).
func TestRunProjectionCommitLandsLateUnderAKeyedHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := e.dst.Pool.Exec(ctx, `CREATE TABLE keyed (pos bigint PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	e.appendAndRelay(t, ctx, 10)
	pool := annalstest.NewCutPool(t, e.dst)
	var (
		armed  atomic.Bool
		frozen atomic.Int32
		cut    atomic.Pointer[annalstest.CutConn]
	)
	resume := func() {
		if pid := frozen.Swap(0); pid != 0 {
			_ = syscall.Kill(int(pid), syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	p := keyed{at: 4, hook: func(ctx context.Context, tx pgx.Tx) error {
		if !armed.CompareAndSwap(false, true) {
			return nil
		}
		c, err := pool.Of(ctx, tx)
		if err != nil {
			return err
		}
		pid := tx.Conn().PgConn().PID()
		c.StopServerAndCutAfter(t, annalstest.HasCommit, pid, func() { frozen.Store(int32(pid)) })
		cut.Store(c)
		return nil
	}}
	var logs annalstest.LogBuffer
	c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "keyed", Batch: 4, RetryBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, pool.Pool, p) })
	defer func() {
		if stop != nil {
			_ = stop()
		}
	}()
	// Let the first attempt commit once the retry's row waits for its: for
	// the stopped backend, not any in the cluster, which the other tests'
	// databases share.
	annalstest.WaitForErr(t, 20*time.Second, func() error {
		stopped := frozen.Load()
		if stopped == 0 {
			return errors.New("event 4's backend is not stopped yet (is the test cluster on this machine?)")
		}
		var waiting int
		if err := e.dst.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int4 = ANY(pg_blocking_pids(pid))`, stopped).Scan(&waiting); err != nil {
			return err
		}
		if waiting == 0 {
			return errors.New("the retry of event 4 does not wait for the first attempt's row")
		}
		return nil
	})
	resume()
	count := func() (rows int, seq, pos int64) {
		_ = e.dst.Pool.QueryRow(ctx, `SELECT count(*) FROM keyed`).Scan(&rows)
		_ = e.dst.Pool.QueryRow(ctx, `SELECT stream_seq, position FROM annals.relay_checkpoints WHERE consumer = 'keyed'`).Scan(&seq, &pos)
		return rows, seq, pos
	}
	annalstest.WaitForErr(t, 15*time.Second, func() error {
		if rows, seq, pos := count(); rows != 10 || seq != 10 || pos != 10 {
			out := logs.String()
			return errors.Newf("%d rows, checkpoint %d (position %d); want 10, 10 (10); the log ends:\n%s", rows, seq, pos, out[max(0, len(out)-1500):])
		}
		return nil
	})
	err = stop()
	stop = nil
	if err != nil {
		t.Fatal(err)
	}
	if c := cut.Load(); c == nil || !c.Cut() {
		t.Fatal("the connection of event 4's transaction was not cut after its COMMIT")
	}
	if out := logs.String(); !strings.Contains(out, "the checkpoint holds this relayed event already") {
		t.Fatalf("the log does not say the checkpoint held event 4 already:\n%s", out)
	}
}
