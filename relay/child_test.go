package relay_test

// The relay as a child process (the test binary, re-executed), so that the
// exactly-once test can SIGKILL it the way a crashed service dies.

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/internal/childproc"
	"github.com/annals-dev/annals/relay"
)

const childEnv = "ANNALS_RELAY_CHILD"

type childSpec struct {
	URL      string `json:"url"`
	NATS     string `json:"nats"`
	Instance string `json:"instance"`
}

func runChild(raw string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "child: bad %s: %v\n", childEnv, err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).
		With(slog.String("instance", spec.Instance))
	ctx, stop := childproc.Context(logger)
	defer stop()
	pool, err := childproc.Pool(ctx, spec.URL, spec.Instance)
	if err != nil {
		logger.Error("child: connect", slog.Any("error", err))
		return 1
	}
	defer pool.Close()
	nc, err := nats.Connect(spec.NATS, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.RetryOnFailedConnect(true))
	if err != nil {
		logger.Error("child: connect to NATS", slog.Any("error", err))
		return 1
	}
	defer nc.Close()
	r, err := relay.New(pool, nc, &relay.Config{
		Owner: spec.Instance, BatchSize: 100, AckTimeout: 2 * time.Second,
		LockRetryInterval: 50 * time.Millisecond, PollInterval: 200 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
		Lock: &advisorylock.Config{CheckInterval: 100 * time.Millisecond}, Logger: logger,
	})
	if err != nil {
		logger.Error("child: relay", slog.Any("error", err))
		return 1
	}
	logger.Info("child: relaying")
	for ctx.Err() == nil {
		if err := r.Run(ctx); err != nil {
			logger.Warn("child: relay stopped; again", slog.Any("error", err))
			time.Sleep(100 * time.Millisecond) // back off before retrying (NATS is restarting), not a wait for a condition
		}
	}
	return 0
}
