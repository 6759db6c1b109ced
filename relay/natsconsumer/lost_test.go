package natsconsumer_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// TestAMissingStreamIsWaitedForWithBackoff: while the relay's stream is
// deleted under a running consumer, it looks it up again with a doubling
// pause and says once, at WARN, that the stream is missing; when the relay
// makes it again it follows it. Before, it looked it up and logged "the
// relay's stream or the durable consumer is gone ... no responders" every
// RetryBackoff (500 ms by default: 120 WARNs a minute).
func TestAMissingStreamIsWaitedForWithBackoff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.appendAndRelay(t, ctx, 3)
	c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "tally", RetryBackoff: 100 * time.Millisecond, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, tally{}) })
	annalstest.WaitFor(t, 10*time.Second, func() bool { return e.tallied(ctx) == once(3) })

	e.deleteStream(t, ctx)
	deleted := time.Now()
	// Five failed look-ups after the first (each logged at DEBUG, before
	// at WARN as the first was): after pauses of 0.1, 0.2, 0.4, 0.8 and
	// 1.6 s (before: 0.1 s each).
	const failed = "looking them up again failed"
	annalstest.WaitFor(t, 20*time.Second, func() bool { return strings.Count(logs.String(), failed) >= 5 })
	if took := time.Since(deleted); took < 1200*time.Millisecond {
		t.Errorf("five look-ups of the missing stream took %v; want the pauses doubled (3.1 s)", took)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "the relay's stream is missing") {
		t.Errorf("the log while the stream is missing (%d WARNs, want one saying the stream is missing):\n%s", n, logs.String())
	}

	e.appendAndRelay(t, ctx, 2) // the relay makes the stream again
	annalstest.WaitFor(t, 20*time.Second, func() bool { return e.tallied(ctx) == once(5) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "found again") {
		t.Errorf("the log does not say the stream was found again:\n%s", logs.String())
	}
}
