package projection_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// beforeQuery runs hook (once) when a query whose SQL contains match
// starts, before it is sent.
type beforeQuery struct {
	match string
	once  sync.Once
	hook  func()
}

func (b *beforeQuery) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, b.match) {
		b.once.Do(b.hook)
	}
	return ctx
}

func (b *beforeQuery) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestBlueGreenAwaitRollbackBetweenReads: a rollback that commits after
// Await has looked up the live generation (g2, past the position) but
// before it reads that generation's checkpoints does not make Await
// return: readers see g1 by then, which stopped below the position, so
// Await waits for g1 (and returns once version 1's runner has caught it
// up). Await read the live generation and its checkpoints in two
// statements, and returned on the checkpoints of a generation that was no
// longer live. A tracer on the Awaiter's pool runs the rollback just
// before the checkpoints' read, so the race is hit every time.
func TestBlueGreenAwaitRollbackBetweenReads(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 5, 5)
	if c, err := bgRunner(t, db, "v2", 2, false).RebuildBlueGreen(ctx, bgName, nil); err != nil || c.To != 2 {
		t.Fatalf("cut-over to g2: %+v %v", c, err)
	}
	// An event that g2 applies and g1 (retired at the cut-over) does not.
	if err := log.add(ctx, 1, 1); err != nil {
		t.Fatal(err)
	}
	head := headOf(t, db)
	if err := bgRunner(t, db, "v2", 2, false).RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if cp := checkpointOf(t, db, "bgstats#g2"); cp < head {
		t.Fatalf("g2 at %d, want %d", cp, head)
	}

	a, rolledBack := awaiterRollingBack(t, ctx, db)

	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := a.Await(actx, bgName, head)
	ranRollback(t, rolledBack)
	if s := state(t, db, 1); s != projection.GenerationLive {
		t.Fatalf("generation 1 is %s after the rollback", s)
	}
	if cp := checkpointOf(t, db, "bgstats#g1"); cp >= head {
		t.Fatalf("g1 at %d, want below %d", cp, head)
	}
	var behind *projection.BehindError
	if !errors.As(err, &behind) {
		t.Fatalf("Await returned %v after the rollback to g1 (at %d, below %d): readers do not see the event", err, checkpointOf(t, db, "bgstats#g1"), head)
	}
	if behind.Projection != "bgstats#g1" {
		t.Fatalf("Await was behind on %s, want bgstats#g1", behind.Projection)
	}

	// Version 1's runner catches g1 up; the wait ends.
	bgRunInBackground(t, bgRunner(t, db, "v1", 1, false))
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := a.Await(wctx, bgName, head); err != nil {
		t.Fatalf("Await once g1 is caught up: %v", err)
	}
	if cp := checkpointOf(t, db, "bgstats#g1"); cp < head {
		t.Fatalf("Await returned with g1 at %d, before %d", cp, head)
	}
}

// TestBlueGreenAwaitRollbackDeadLetter: the dead letter of a generation a
// rollback has just retired is not what readers see either: Await, whose
// event g2 dead-lettered, does not return ErrDeadLettered once a rollback
// (between its read of the live generation and of its checkpoints) has
// made g1 live, which may apply the event; it waits for g1.
func TestBlueGreenAwaitRollbackDeadLetter(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 5, 2)
	var fixed atomic.Bool
	fixed.Store(true)
	var logs annalstest.LogBuffer
	v2 := failingRunner(t, db, "v2", &fixed, false, &logs)
	if c, err := v2.RebuildBlueGreen(ctx, bgName, nil); err != nil || c.To != 2 {
		t.Fatalf("cut-over to g2: %+v %v", c, err)
	}
	// Stream s000010's third event, which g2 dead-letters.
	fixed.Store(false)
	if err := log.add(ctx, 6, 3); err != nil {
		t.Fatal(err)
	}
	head := headOf(t, db)
	annalstest.WaitForErr(t, 20*time.Second, func() error {
		err := v2.RunUntilCaughtUp(ctx)
		if cp := checkpointOf(t, db, "bgstats#g2"); cp < head {
			return errors.Newf("g2 at %d, want %d (%v)", cp, head, err)
		}
		return nil
	})
	if err := projection.Await(ctx, db.Pool, bgName, head, &projection.AwaitOptions{Schema: db.Schema}); !errors.Is(err, projection.ErrDeadLettered) {
		t.Fatalf("Await on g2: %v, want ErrDeadLettered", err)
	}

	a, rolledBack := awaiterRollingBack(t, ctx, db)
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := a.Await(actx, bgName, head)
	ranRollback(t, rolledBack)
	var behind *projection.BehindError
	if !errors.As(err, &behind) || behind.Projection != "bgstats#g1" {
		t.Fatalf("Await returned %v after the rollback to g1 (at %d, below %d), want it behind on bgstats#g1", err, checkpointOf(t, db, "bgstats#g1"), head)
	}
	bgRunInBackground(t, bgRunner(t, db, "v1", 1, false))
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := a.Await(wctx, bgName, head); err != nil {
		t.Fatalf("Await once g1 is caught up: %v", err)
	}
	readerSees(t, db, log, 1)
}

// awaiterRollingBack returns an Awaiter whose pool rolls bgName back (to
// the generation the live one replaced) just before its first read of the
// checkpoints (the dead-letter join of AwaitCheckpoints): between its read
// of the live generation and of that generation's checkpoints. The
// rollback's error arrives on the channel.
func awaiterRollingBack(t *testing.T, ctx context.Context, db *annalstest.DB) (*projection.Awaiter, <-chan error) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	rolledBack := make(chan error, 1)
	cfg.ConnConfig.Tracer = &beforeQuery{match: "dead_letters d", hook: func() {
		_, err := projection.Rollback(context.WithoutCancel(ctx), db.Pool, db.Schema, bgName)
		rolledBack <- err
	}}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	a, err := projection.NewAwaiter(pool, &projection.AwaitOptions{Schema: db.Schema, PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a, rolledBack
}

// ranRollback fails the test unless awaiterRollingBack's rollback ran, and
// succeeded, during the wait.
func ranRollback(t *testing.T, rolledBack <-chan error) {
	t.Helper()
	select {
	case err := <-rolledBack:
		if err != nil {
			t.Fatalf("rollback: %v", err)
		}
	default:
		t.Fatal("the rollback did not run during the wait")
	}
}
