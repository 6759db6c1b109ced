package saga_test

// Child processes: the crash test runs each runner in a process of its own
// (the test binary, re-executed), so that a leader can be killed with
// SIGKILL the way a crashed service dies: no deferred call, no graceful
// release, only the kernel closing its sockets.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
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
}

// runChild is the child's main: it runs a Runner with the counter saga
// until SIGTERM or until its parent goes away. It returns the exit status.
func runChild(raw string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "child: bad %s: %v\n", childEnv, err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).
		With(slog.String("instance", spec.Instance))
	// The parent holds the write end of stdin: EOF means it died, and a
	// runner must not outlive it.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		logger.Error("child: stdin closed, the parent is gone; exiting")
		os.Exit(3)
	}()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	cfg, err := pgxpool.ParseConfig(spec.URL)
	if err != nil {
		logger.Error("child: parse URL", slog.Any("error", err))
		return 2
	}
	// Every connection carries the instance ID, so the parent can tell whose
	// session holds the lock.
	cfg.ConnConfig.RuntimeParams["application_name"] = spec.Instance
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
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
	if err := saga.Register(r, counterSaga(reg, spec.TimerAfter), scfg); err != nil {
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

// child is a runner process started by startChild.
type child struct {
	t      testing.TB
	id     string
	cmd    *exec.Cmd
	stdin  io.WriteCloser // kept open: the child exits when it reads EOF
	log    *syncBuffer
	exited chan struct{}
	err    error
}

// startChild starts the test binary as a runner process named instanceID
// on db. It is killed, at the latest, when the test ends; if the test
// failed, its log is shown.
func startChild(t testing.TB, db *annalstest.DB, instanceID string, timerAfter time.Duration) *child {
	t.Helper()
	spec, err := json.Marshal(childSpec{URL: db.URL, Instance: instanceID, TimerAfter: timerAfter})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=50")
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec), "GORACE="+gorace)
	c := &child{t: t, id: instanceID, cmd: cmd, log: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child %s: %v", instanceID, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		if c.alive() {
			_ = cmd.Process.Kill()
		}
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("child %s (pid %d) has not exited 10s after SIGKILL", c.id, cmd.Process.Pid)
		}
		out := c.log.String()
		for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
			if strings.Contains(out, bad) {
				t.Errorf("child %s (pid %d) reported %q", c.id, cmd.Process.Pid, bad)
			}
		}
		if t.Failed() {
			t.Logf("log of child %s (pid %d):\n%s", c.id, cmd.Process.Pid, tail(out, 8000))
		}
	})
	return c
}

func (c *child) alive() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// kill kills the child with SIGKILL and waits for it to be gone.
func (c *child) kill() {
	c.t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil && c.alive() {
		c.t.Fatalf("SIGKILL child %s: %v", c.id, err)
	}
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		c.t.Fatalf("child %s still runs 10s after SIGKILL", c.id)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes and reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// tail returns the last n bytes of s, from a line start where possible.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "[...]\n" + s
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
