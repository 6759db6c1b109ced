package archive_test

// The SIGKILL test runs an archiver in a process of its own (the test
// binary, re-executed), so that it can die mid-run the way a crashed
// service does: no deferred call, only the kernel closing its sockets.

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/archive"
	"github.com/annals-dev/annals/internal/childproc"
)

const childEnv = "ANNALS_ARCHIVE_CHILD"

type childSpec struct {
	URL      string        `json:"url"`
	Instance string        `json:"instance"`
	Before   int64         `json:"before"`
	Pause    time.Duration `json:"pause"`
}

func runChild(raw string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "child: bad %s: %v\n", childEnv, err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With(slog.String("instance", spec.Instance))
	ctx, stop := childproc.Context(logger)
	defer stop()
	pool, err := childproc.Pool(ctx, spec.URL, spec.Instance)
	if err != nil {
		logger.Error("child: connect", slog.Any("error", err))
		return 1
	}
	defer pool.Close()
	a, err := archive.New(pool, &archive.Config{
		BatchSize: 7, Pause: spec.Pause, InstanceID: spec.Instance, Logger: logger,
		Lock: &advisorylock.Config{CheckInterval: 100 * time.Millisecond, Logger: logger},
	})
	if err != nil {
		logger.Error("child: new", slog.Any("error", err))
		return 1
	}
	p, err := a.RunOnce(ctx, spec.Before)
	logger.Info("child: run returned", slog.Any("progress", p), slog.Any("error", err))
	if err != nil {
		return 1
	}
	return 0
}

func startChild(t testing.TB, db *annalstest.DB, spec childSpec) *childproc.Child {
	t.Helper()
	spec.URL = db.URL
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	return childproc.Start(t, spec.Instance, childEnv+"="+string(raw))
}
