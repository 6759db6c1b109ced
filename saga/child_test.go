package saga_test

// Child processes: the crash test runs each runner in a process of its own
// (the test binary, re-executed), so that a leader can be killed with
// SIGKILL the way a crashed service dies: no deferred call, no graceful
// release, only the kernel closing its sockets.

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/childproc"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

// childEnv holds a child's configuration (a JSON childSpec). When it is set,
// TestMain runs the child instead of the tests.
const childEnv = "ANNALS_SAGA_CHILD"

type childSpec struct {
	URL      string `json:"url"`
	Instance string `json:"instance"`
	// TimerAfter, if set, makes the counter saga schedule a Deadline this far
	// ahead of each instance's first event, through a scheduler.
	TimerAfter time.Duration `json:"timer_after,omitempty"`
	// Tally makes the counter saga command the Tally aggregate too.
	Tally bool `json:"tally,omitempty"`
}

// runChild is the child's main: it runs a Runner with the counter saga
// until SIGTERM or until its parent goes away. It returns the exit status.
func runChild(raw string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "child: bad %s: %v\n", childEnv, err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: childLogLevel()})).
		With(slog.String("instance", spec.Instance))
	ctx, stop := childproc.Context(logger)
	defer stop()
	pool, err := childproc.Pool(ctx, spec.URL, spec.Instance)
	if err != nil {
		logger.Error("child: connect", slog.Any("error", err))
		return 1
	}
	defer pool.Close()
	reg := registry()
	store, err := eventstore.New(pool, &eventstore.Config{Registry: reg})
	if err != nil {
		logger.Error("child: store", slog.Any("error", err))
		return 1
	}
	r, err := projection.NewRunner(pool, &projection.Config{
		InstanceID:        spec.Instance,
		PollInterval:      200 * time.Millisecond,
		LockRetryInterval: 200 * time.Millisecond,
		RetryBackoff:      500 * time.Millisecond,
		HeartbeatInterval: time.Second,
		ShutdownTimeout:   5 * time.Second,
		Lock:              &advisorylock.Config{CheckInterval: 100 * time.Millisecond, Logger: logger},
		Logger:            logger,
	})
	if err != nil {
		logger.Error("child: new runner", slog.Any("error", err))
		return 1
	}
	scfg := &saga.Config{Store: store, Logger: logger}
	if spec.TimerAfter > 0 {
		if scfg.Scheduler, err = scheduler.New(store, &scheduler.Config{Logger: logger}); err != nil {
			logger.Error("child: scheduler", slog.Any("error", err))
			return 1
		}
	}
	var tally *aggregate.Repository[*Tally]
	if spec.Tally {
		if tally, err = aggregate.NewRepository(store, "tally", func() *Tally { return &Tally{} }, nil); err != nil {
			logger.Error("child: tally repository", slog.Any("error", err))
			return 1
		}
	}
	if err := saga.Register(r, tallySaga(reg, spec.TimerAfter, tally), scfg); err != nil {
		logger.Error("child: register", slog.Any("error", err))
		return 1
	}
	logger.Info("child: running", slog.Int("pid", os.Getpid()))
	if err := r.Run(ctx); err != nil {
		logger.Error("child: run", slog.Any("error", err))
		return 1
	}
	return 0
}

// childLogLevel is the children's log level: INFO, or DEBUG when
// ANNALS_SAGA_CHILD_DEBUG is set (to look into a failure of the crash test).
func childLogLevel() slog.Level {
	if os.Getenv("ANNALS_SAGA_CHILD_DEBUG") != "" {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

// startChild starts the test binary as a runner process named instanceID
// on db. It is killed, at the latest, when the test ends; if the test
// failed, its log is shown.
func startChild(t testing.TB, db *annalstest.DB, instanceID string, timerAfter time.Duration) *childproc.Child {
	return startTallyChild(t, db, instanceID, timerAfter, false)
}

// startTallyChild is startChild; with tally, the child's saga commands the
// Tally aggregate too.
func startTallyChild(t testing.TB, db *annalstest.DB, instanceID string, timerAfter time.Duration, tally bool) *childproc.Child {
	t.Helper()
	spec, err := json.Marshal(childSpec{URL: db.URL, Instance: instanceID, TimerAfter: timerAfter, Tally: tally})
	if err != nil {
		t.Fatal(err)
	}
	return childproc.Start(t, instanceID, childEnv+"="+string(spec), "GOTRACEBACK=all")
}

// eventually polls cond every 10 ms until it holds or timeout has passed.
func eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond) // the polling period, not a wait for the condition
	}
}
