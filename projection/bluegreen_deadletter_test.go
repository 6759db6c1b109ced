package projection_test

// A blue/green cut-over never moves readers to a generation that lacks
// events: while the new generation has unresolved dead letters, the
// cut-over waits (and says why), and it proceeds once an operator retries
// or skips them.

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// failingStats is version 2 of statsProjection whose handler fails on the
// third event of every fourth stream until fixed is set.
func failingStats(fixed *atomic.Bool) *projection.Typed {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Counted](reg, "bg.counted")
	p := projection.New(bgName, reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE stats (stream text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)`))
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Counted]) error {
		if !fixed.Load() && e.Data.V == 3 && strings.HasSuffix(e.StreamID, "0") {
			return errors.Newf("version 2 cannot handle %s/3 yet", e.StreamID)
		}
		_, err := tx.Exec(ctx, `INSERT INTO stats VALUES ($1, 1, $2)
			ON CONFLICT (stream) DO UPDATE SET n = stats.n + 1, total = stats.total + $2`, e.StreamID, e.Data.V+bgBonus)
		return err
	})
	return p
}

func failingRunner(t *testing.T, db *annalstest.DB, id string, fixed *atomic.Bool, auto bool, logs *annalstest.LogBuffer) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(db.Pool, &projection.Config{
		InstanceID: id, PollInterval: 100 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(failingStats(fixed), &projection.Options{
		Retry:     &projection.RetryPolicy{MaxRetries: -1},
		BlueGreen: &projection.BlueGreen{Version: 2, AutoRebuild: auto, CheckInterval: 100 * time.Millisecond},
	}); err != nil {
		t.Fatal(err)
	}
	return r
}

func unresolved(t *testing.T, db *annalstest.DB, gen int) int {
	t.Helper()
	return generation(t, db, gen).Unresolved
}

// TestBlueGreenCutoverWaitsForDeadLetters: a runner of version 2 whose
// handler fails on some events (ParkStream) replays its generation to the
// head, but does not cut over while the generation has dead letters; it
// logs why; after dlq retry (the handler fixed) the events are re-delivered
// and it cuts over to a complete read model.
func TestBlueGreenCutoverWaitsForDeadLetters(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 20, 10)
	bgRunInBackground(t, bgRunner(t, db, "v1", 1, false))

	var fixed atomic.Bool
	logs := &annalstest.LogBuffer{}
	bgRunInBackground(t, failingRunner(t, db, "v2", &fixed, true, logs))
	const why = "blue/green cut-over waits: the new generation has unresolved dead letters"
	head := headOf(t, db)
	annalstest.WaitFor(t, 60*time.Second, func() bool {
		return state(t, db, 2) == projection.GenerationLive ||
			(strings.Contains(logs.String(), why) && checkpointOf(t, db, "bgstats#g2") >= head)
	})
	if s := state(t, db, 2); s != projection.GenerationBuilding {
		t.Fatalf("generation 2 is %s with %d unresolved dead letters; want building (readers would see a partial read model)",
			s, unresolved(t, db, 2))
	}
	if checkpointOf(t, db, "bgstats#g2") < head || unresolved(t, db, 2) == 0 {
		t.Fatalf("generation 2 at %d (head %d), %d unresolved dead letters", checkpointOf(t, db, "bgstats#g2"), head, unresolved(t, db, 2))
	}
	// Logged when the count changes (it grew during the replay) and every
	// minute, not at every check.
	if n, max := strings.Count(logs.String(), why), unresolved(t, db, 2); n < 1 || n > max {
		t.Fatalf("the wait was logged %d times for %d dead letters", n, max)
	}
	if !strings.Contains(logs.String(), "annals dlq retry") {
		t.Fatalf("the log does not say what resolves the wait:\n%s", logs.String())
	}
	readerSees(t, db, log, 1)

	fixed.Store(true)
	dl, err := deadletter.New(db.Pool, &deadletter.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := dl.RetryAll(ctx, "bgstats#g2"); err != nil || len(c.Retried) == 0 {
		t.Fatalf("retry: %+v, %v", c, err)
	}
	annalstest.WaitFor(t, 60*time.Second, func() bool { return state(t, db, 2) == projection.GenerationLive })
	readerSees(t, db, log, 2)
	exactAt(t, db, "rm_bgstats_g2.stats", "bgstats#g2", 2)
}

// TestBlueGreenRebuildWaitsForDeadLetters: RebuildBlueGreen of a version
// whose handler fails on some events replays to the head, then waits
// instead of cutting over, saying why in RebuildProgress.Waiting; an
// operator's dlq skip (a deliberate choice to do without those events)
// lets it cut over.
func TestBlueGreenRebuildWaitsForDeadLetters(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 20, 10)
	bgRunInBackground(t, bgRunner(t, db, "v1", 1, false))

	var fixed atomic.Bool
	r := failingRunner(t, db, "v2", &fixed, false, &annalstest.LogBuffer{})
	var mu sync.Mutex
	var waiting string
	type result struct {
		c   projection.Cutover
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := r.RebuildBlueGreen(ctx, bgName, &projection.RebuildOptions{OnProgress: func(p projection.RebuildProgress) {
			mu.Lock()
			defer mu.Unlock()
			if p.Waiting != "" {
				waiting = p.Waiting
			}
		}})
		done <- result{c, err}
	}()
	var res *result
	annalstest.WaitFor(t, 60*time.Second, func() bool {
		select {
		case x := <-done:
			res = &x
			return true
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return waiting != ""
	})
	if res != nil {
		t.Fatalf("RebuildBlueGreen returned %+v, %v while generation 2 had %d unresolved dead letters; want it to wait",
			res.c, res.err, unresolved(t, db, 2))
	}
	mu.Lock()
	t.Logf("waiting: %s", waiting)
	if !strings.Contains(waiting, "annals dlq") || !strings.Contains(waiting, "bgstats#g2") {
		t.Errorf("Waiting does not say what resolves it: %q", waiting)
	}
	mu.Unlock()
	if s := state(t, db, 2); s != projection.GenerationBuilding {
		t.Fatalf("generation 2 is %s", s)
	}

	dl, err := deadletter.New(db.Pool, &deadletter.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	page, err := dl.List(ctx, deadletter.Filter{Subscriber: "bgstats#g2", Status: deadletter.StatusOpen})
	if err != nil {
		t.Fatal(err)
	}
	skipped := 0
	for _, d := range page.DeadLetters {
		if d.Reason == deadletter.ReasonFailed {
			if _, err := dl.Skip(ctx, d.ID); err != nil {
				t.Fatal(err)
			}
			skipped++
		}
	}
	if skipped == 0 {
		t.Fatalf("no failed dead letter among %+v", page.DeadLetters)
	}
	select {
	case x := <-done:
		if x.err != nil || x.c.To != 2 {
			t.Fatalf("RebuildBlueGreen: %+v, %v", x.c, x.err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("RebuildBlueGreen did not cut over after the dead letters were skipped")
	}
	if s := state(t, db, 2); s != projection.GenerationLive {
		t.Fatalf("generation 2 is %s", s)
	}
	if n := unresolved(t, db, 2); n != 0 {
		t.Fatalf("%d unresolved dead letters after the cut-over", n)
	}
}
