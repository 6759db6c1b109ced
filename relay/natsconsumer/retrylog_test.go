package natsconsumer_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// TestARetriedFailureIsLoggedOnceAMinute: a handler that keeps failing (its
// database down, in an operator's trial: two WARNs a second for as long as
// it lasted) is logged at WARN once, then at DEBUG until a minute has
// passed, each with the attempts so far; the success after it at INFO,
// with the attempts it took.
func TestARetriedFailureIsLoggedOnceAMinute(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e.appendAndRelay(t, ctx, 5)
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var mu sync.Mutex
	tries := 0
	c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "tally", RetryBackoff: 2 * time.Millisecond, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(ctx, func(ctx context.Context) error {
		return c.RunProjection(ctx, e.dst.Pool, flakyTally{at: 2, fails: 25, mu: &mu, tries: &tries})
	})
	annalstest.WaitFor(t, 20*time.Second, func() bool { return e.tallied(ctx) == once(5) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	const retry = `msg="annals: handling a relayed event failed; retrying"`
	if n := strings.Count(out, "level=WARN "+retry); n != 1 {
		t.Errorf("%d WARNs of the retried failure; want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "level=DEBUG "+retry); n != 24 {
		t.Errorf("%d DEBUGs of the retried failure; want 24:\n%s", n, out)
	}
	for _, want := range []string{"attempts=1 ", "attempts=25 ", "failing_for=",
		`level=INFO msg="annals: handled a relayed event after failures" consumer=tally position=2 attempts=26`} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
}
