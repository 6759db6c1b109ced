package walsource_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/walsource"
)

// logBuffer is an io.Writer for a slog handler that tests read while the
// code under test writes.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// privateCluster starts a PostgreSQL cluster of the test's own (for tests
// that change server settings or restart it), migrated, with an "applied"
// table for appliedProjection, and stops it when the test ends.
func privateCluster(t *testing.T, ctx context.Context) (*pgcluster.Cluster, *pgxpool.Pool) {
	t.Helper()
	cluster, pool := annalstest.PrivateCluster(t, ctx, nil)
	if _, err := pool.Exec(ctx, `CREATE TABLE applied (global_sequence bigint PRIMARY KEY, event_id uuid NOT NULL UNIQUE)`); err != nil {
		t.Fatal(err)
	}
	return cluster, pool
}

// runWoken runs appliedProjection (with opts) in a Runner woken by wake and
// polling only every pollInterval, until the returned stop is called.
func runWoken(t *testing.T, ctx context.Context, pool *pgxpool.Pool, wake *walsource.Wake, pollInterval time.Duration, opts *projection.Options) (stop func()) {
	t.Helper()
	r, err := projection.NewRunner(pool, &projection.Config{
		Wake: wake.For, PollInterval: pollInterval, RetryBackoff: 100 * time.Millisecond,
		LockRetryInterval: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(appliedProjection{}, opts); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Runner.Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// slotActive reports whether a session streams from the slot.
func slotActive(ctx context.Context, pool *pgxpool.Pool, slot string) bool {
	var active bool
	_ = pool.QueryRow(ctx, `SELECT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false)`, slot).Scan(&active)
	return active
}

// TestWakeRecreatesALostSlot: a slot that max_slot_wal_keep_size
// invalidated while its runner was down (wal_status lost) can never be
// streamed again. The next leadership drops it and creates it afresh,
// saying so once with PostgreSQL's DETAIL, so the next append wakes the
// subscriber at once rather than at its poll interval (five minutes here).
// Private cluster: the test lowers max_slot_wal_keep_size for the whole
// server.
func TestWakeRecreatesALostSlot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, pool := privateCluster(t, ctx)
	store, err := eventstore.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	wake, err := walsource.NewWake(ctx, pool, &walsource.WakeConfig{
		StatusInterval: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	slot := wake.Slot("applied", 0)
	applied := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM applied`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	walStatus := func() string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1), 'none')`, slot).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	appendOne := func() {
		t.Helper()
		if _, err := store.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "moved", Data: map[string]int{}}); err != nil {
			t.Fatal(err)
		}
	}
	const poll = 5 * time.Minute

	stop := runWoken(t, ctx, pool, wake, poll, nil)
	annalstest.WaitFor(t, 30*time.Second, func() bool { return slotActive(ctx, pool, slot) })
	appendOne()
	annalstest.WaitFor(t, 20*time.Second, func() bool { return applied() == 1 })
	stop()

	// With the runner down, keep almost no WAL for slots and move the
	// server's WAL on until the slot is invalidated.
	for _, q := range []string{`ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`, `SELECT pg_reload_conf()`, `CREATE TABLE junk (x text)`} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	annalstest.WaitFor(t, 60*time.Second, func() bool {
		for _, q := range []string{`INSERT INTO junk SELECT repeat('x', 100) FROM generate_series(1, 1000)`, `SELECT pg_switch_wal()`, `CHECKPOINT`} {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		return walStatus() == "lost"
	})

	runWoken(t, ctx, pool, wake, poll, nil)
	annalstest.WaitFor(t, 30*time.Second, func() bool { return slotActive(ctx, pool, slot) })
	appendOne()
	// Far below the poll interval: the recreated slot woke the subscriber.
	annalstest.WaitFor(t, 20*time.Second, func() bool { return applied() == 2 })
	if s := walStatus(); s == "lost" || s == "none" {
		t.Fatalf("the slot's wal_status is %s after the runner came back", s)
	}
	out := logs.String()
	if n := strings.Count(out, "replication slot invalidated"); n != 1 {
		t.Fatalf("the log says %d times that the slot was invalidated, want once:\n%s", n, out)
	}
	if !strings.Contains(out, "This slot has been invalidated because it exceeded the maximum reserved size") {
		t.Fatalf("the log lacks PostgreSQL's DETAIL on the invalidated slot:\n%s", out)
	}
}
