package projection_test

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// TestReadPoolDownIsLoggedOnceAMinute: while the read pool (a replica)
// refuses connections, the runner's leadership goes on and retries its
// read after each RetryBackoff; the failure is logged at WARN once, then
// at DEBUG with the count, and the first read that works again at INFO.
// An operator's trial with the replica stopped read two WARNs a second.
func TestReadPoolDownIsLoggedOnceAMinute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(9, 10))
	if _, err := appendEvents(ctx, b.store, rng, 5, nil); err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	pc, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		if down.Load() {
			return errors.New("the replica is down")
		}
		return nil
	}
	readPool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer readPool.Close()
	var logs annalstest.LogBuffer
	watch := &orderRecorder{}
	cfg := testConfig(time.Second) // RetryBackoff 50ms
	cfg.ReadPool = readPool
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := projection.NewRunner(b.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(watch, nil); err != nil {
		t.Fatal(err)
	}
	stop := runInBackground(t, r)
	defer stop()
	const failed = `msg="annals: read failed" subscriber=replica-watch partition=0`
	annalstest.WaitFor(t, 20*time.Second, func() bool { return strings.Count(logs.String(), "level=DEBUG "+failed) >= 10 })
	down.Store(false)
	annalstest.WaitFor(t, 20*time.Second, func() bool { return watch.count() == 5 })
	annalstest.WaitFor(t, 5*time.Second, func() bool {
		return strings.Contains(logs.String(), `level=INFO msg="annals: reads work again" subscriber=replica-watch partition=0 failures=`)
	})
	out := logs.String()
	if n := strings.Count(out, "level=WARN "+failed); n != 1 {
		t.Errorf("%d WARNs of the failed read within a minute; want 1:\n%s", n, out)
	}
	for _, want := range []string{"failures=1 ", "failures=10 ", "failing_for=", "the replica is down"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
}
