package catchup

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
)

// logBuffer is an io.Writer for a slog handler that tests read while it is
// written.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns the lines at level (e.g. "WARN") that contain msg.
func (b *logBuffer) count(level, msg string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, line := range strings.Split(b.buf.String(), "\n") {
		if strings.Contains(line, "level="+level) && strings.Contains(line, msg) {
			n++
		}
	}
	return n
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// A run of failures logs its first at WARN, its repeats at DEBUG with a
// WARN summary every failureSummary, and its end at INFO; a failure after a
// quiet of more than failureRunGap starts a new run.
func TestFailureLog(t *testing.T) {
	t.Parallel()
	var buf logBuffer
	now := time.Unix(1000, 0)
	f := &failureLog{log: buf.logger(), now: func() time.Time { return now }}
	ctx := context.Background()
	const msg = "annals: it failed"
	f.recovered(ctx, "back") // no run: nothing
	for range 30 {
		f.failed(ctx, msg)
		now = now.Add(time.Second)
	}
	if w, d := buf.count("WARN", msg), buf.count("DEBUG", msg); w != 1 || d != 29 {
		t.Fatalf("30 failures a second apart: %d WARN, %d DEBUG; want 1 and 29:\n%s", w, d, buf.String())
	}
	for range 40 {
		f.failed(ctx, msg)
		now = now.Add(time.Second)
	}
	if w := buf.count("WARN", msg+" (still failing)"); w != 1 {
		t.Fatalf("70 s of failures: %d summaries, want 1:\n%s", w, buf.String())
	}
	f.recovered(ctx, "back")
	f.recovered(ctx, "back")
	if n := buf.count("INFO", "back"); n != 1 || !strings.Contains(buf.String(), "failures=70") {
		t.Fatalf("recovered: %d INFO lines, want 1 with failures=70:\n%s", n, buf.String())
	}
	f.failed(ctx, msg) // a new outage
	if w := buf.count("WARN", msg); w != 3 {
		t.Fatalf("the first failure of a new run: %d WARN lines in all, want 3:\n%s", w, buf.String())
	}
	now = now.Add(failureRunGap + time.Second)
	f.failed(ctx, msg) // long after: another run
	if w := buf.count("WARN", msg); w != 4 {
		t.Fatalf("a failure %v after the last: %d WARN lines in all, want 4:\n%s", failureRunGap+time.Second, w, buf.String())
	}
	now = now.Add(failureRunGap + time.Second)
	f.recovered(ctx, "back") // the run ended unseen long ago: no line
	if n := buf.count("INFO", "back"); n != 1 {
		t.Fatalf("a recovery long after the last failure logged: %d INFO lines, want 1:\n%s", n, buf.String())
	}
}

// While the database refuses connections, the listener logs the loss once
// at WARN, its failed attempts at DEBUG, and a line when it listens again.
func TestListenerOutageLog(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	var (
		buf     logBuffer
		calls   atomic.Int32
		failing atomic.Int32
		pid     atomic.Uint32
	)
	connect := func(ctx context.Context, cc *pgx.ConnConfig) (*pgx.Conn, error) {
		calls.Add(1)
		if failing.Load() > 0 {
			failing.Add(-1)
			return nil, errors.New("database down (test)")
		}
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err == nil {
			pid.Store(conn.PgConn().PID())
		}
		return conn, err
	}
	l, err := newListener(db.Pool.Config().ConnConfig, connect, "", buf.logger())
	if err != nil {
		t.Fatal(err)
	}
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Run(lctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	listening := func() bool {
		select {
		case <-l.Listening():
			return true
		default:
			return false
		}
	}
	annalstest.WaitFor(t, 10*time.Second, listening)

	failing.Store(5)
	before := calls.Load()
	if _, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", int32(pid.Load())); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool { return calls.Load() >= before+6 && listening() })
	const lost = "listener connection lost"
	if w, d := buf.count("WARN", lost), buf.count("DEBUG", lost); w != 1 || d != 5 {
		t.Fatalf("a loss and 5 failed attempts: %d WARN, %d DEBUG lines; want 1 and 5:\n%s", w, d, buf.String())
	}
	if n := buf.count("INFO", "listener listening again"); n != 1 {
		t.Fatalf("%d lines saying the listener listens again, want 1:\n%s", n, buf.String())
	}
}

// The lock retries of all an engine's partitions share one failure log: an
// outage of 500 partitions logs one WARN line, one summary a minute (saying
// how many partitions failed) and one INFO line when it ends, not 500 of
// each.
func TestLockFailuresSharedByPartitions(t *testing.T) {
	t.Parallel()
	var buf logBuffer
	now := time.Unix(1000, 0)
	l := newLockFailures(slog.New(slog.NewTextHandler(&buf, nil))) // INFO and up: 35,000 DEBUG lines would bury a failure
	l.log.now = func() time.Time { return now }
	ctx := context.Background()
	const parts = 500
	sub := func(p int) *Subscription { return &Subscription{Name: "s", Partition: p, Partitions: parts} }
	down := errors.New("database down (test)")
	for range 70 { // every partition fails once a second for 70 s
		for p := range parts {
			l.failed(ctx, sub(p), down)
		}
		now = now.Add(time.Second)
	}
	const msg = "cannot take the subscription lock"
	if w := buf.count("WARN", msg); w != 2 {
		t.Fatalf("70 s of failures of %d partitions: %d WARN lines, want 2 (the first failure and a summary):\n%s", parts, w, buf.String())
	}
	if n := buf.count("WARN", msg+` (still failing)" subscriber=s partition=0 partitions=500`); n != 1 {
		t.Fatalf("the summary does not say that 500 partitions fail:\n%s", buf.String())
	}
	l.took(ctx, &Subscription{Name: "other"}) // never failed: ends nothing
	for p := range parts {
		l.took(ctx, sub(p))
	}
	if n := buf.count("INFO", "took the subscription lock again"); n != 1 || !strings.Contains(buf.String(), "partitions=500 failures=35000") {
		t.Fatalf("%d partitions took their locks again: %d INFO lines, want 1 with partitions=500 failures=35000:\n%s", parts, n, buf.String())
	}
	l.failed(ctx, sub(7), down) // the next outage
	if n := buf.count("WARN", msg+`" subscriber=s partition=7 partitions=1`); n != 1 {
		t.Fatalf("the first failure of a new outage is not a WARN line of its own:\n%s", buf.String())
	}
}

// While the lock session cannot be opened, the partitions of an engine log
// their failure to take the lock once at WARN, the repeats (one per backoff
// and partition) at DEBUG, and a line when they take their locks again.
func TestLockOutageLog(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	const parts = 4
	var (
		buf     logBuffer
		calls   atomic.Int32
		down    atomic.Bool
		leading atomic.Int32
	)
	down.Store(true)
	lockCfg := &advisorylock.Config{Connect: func(ctx context.Context, cc *pgx.ConnConfig) (*pgx.Conn, error) {
		calls.Add(1)
		if down.Load() {
			return nil, errors.New("database down (test)")
		}
		return pgx.ConnectConfig(ctx, cc)
	}}
	e, err := NewEngine(db.Pool, nil, &Config{
		PollInterval: 50 * time.Millisecond, RetryBackoff: 5 * time.Millisecond, Lock: lockCfg, Logger: buf.logger(),
		OnLeadership: func(_ string, _ int, _ int64, l bool) {
			if l {
				leading.Add(1)
			} else {
				leading.Add(-1)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, parts)
	for p := range parts {
		sub := &Subscription{Name: "outage", Partition: p, Partitions: parts, Processor: nopLeader{}}
		go func() { done <- e.Run(ctx, sub) }()
	}
	defer func() {
		cancel()
		for range parts {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}()
	const msg = "cannot take the subscription lock"
	annalstest.WaitFor(t, 20*time.Second, func() bool { return buf.count("DEBUG", msg) >= 4*parts })
	down.Store(false)
	annalstest.WaitFor(t, 20*time.Second, func() bool { return leading.Load() == parts })
	if w := buf.count("WARN", msg); w != 1 {
		t.Fatalf("%d WARN lines for %d failed attempts, want 1:\n%s", w, calls.Load()-1, buf.String())
	}
	if n := buf.count("INFO", "took the subscription lock again"); n != 1 {
		t.Fatalf("%d lines saying the lock was taken again, want 1:\n%s", n, buf.String())
	}
}
