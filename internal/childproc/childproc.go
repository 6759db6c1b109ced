package childproc

import (
	"bytes"
	"context"
	"errors"
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
)

// Child is the test binary running as a child process.
type Child struct {
	// ID names the child in messages (its instance ID).
	ID string

	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser // kept open: the child exits when it reads EOF
	log    syncBuffer     // its stdout and stderr
	exited chan struct{}  // closed when it has exited and been waited for
	err    error          // Wait's error, set before exited is closed
}

// Start runs the test binary (running no tests) with env added to the
// environment, as the child named id. The child is killed, at the latest,
// when the test ends (register database cleanups before calling Start, so
// that the child is gone before its database is dropped); the test fails if
// its log shows a data race or a panic, and shows the log if it failed.
func Start(t testing.TB, id string, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// Under the race detector a process sleeps 1s before exiting, to let
	// other goroutines report; that would count as a graceful stop's time.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=50")
	cmd.Env = append(append(os.Environ(), env...), "GORACE="+gorace)
	c := &Child{ID: id, t: t, cmd: cmd, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &c.log, &c.log
	var err error
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child %s: %v", id, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		if c.Alive() {
			_ = cmd.Process.Kill()
		}
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("child %s (pid %d) has not exited 10s after SIGKILL", c.ID, c.PID())
		}
		out := c.Log()
		for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
			if strings.Contains(out, bad) {
				t.Errorf("child %s (pid %d) reported %q", c.ID, c.PID(), bad)
			}
		}
		if t.Failed() {
			t.Logf("log of child %s (pid %d, %s):\n%s", c.ID, c.PID(), c.State(), Tail(out, 12000))
		}
	})
	return c
}

// PID returns the child's process ID.
func (c *Child) PID() int { return c.cmd.Process.Pid }

// Log returns what the child has written to stdout and stderr so far.
func (c *Child) Log() string { return c.log.String() }

// Exited is closed when the child has exited.
func (c *Child) Exited() <-chan struct{} { return c.exited }

// Alive reports whether the child has not exited yet.
func (c *Child) Alive() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// State describes how the child is, for messages.
func (c *Child) State() string {
	if c.Alive() {
		return "running"
	}
	if c.err == nil {
		return "exited with status 0"
	}
	return "ended: " + c.err.Error()
}

// Kill kills the child with SIGKILL and waits for it to be gone.
func (c *Child) Kill() {
	c.t.Helper()
	// ErrProcessDone: it exited meanwhile (Wait reaped it before exited closed).
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) && c.Alive() {
		c.t.Fatalf("SIGKILL child %s: %v", c.ID, err)
	}
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		c.t.Fatalf("child %s (pid %d) still runs 10s after SIGKILL", c.ID, c.PID())
	}
}

// Term stops the child with SIGTERM, waits for it to exit, and fails the
// test unless it exited with status 0 within timeout.
func (c *Child) Term(timeout time.Duration) {
	c.t.Helper()
	c.SIGTERM()
	c.WaitStopped(timeout)
}

// SIGTERM sends the child SIGTERM: a graceful stop.
func (c *Child) SIGTERM() {
	c.t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		c.t.Fatalf("SIGTERM child %s: %v (%s)", c.ID, err, c.State())
	}
}

// WaitStopped waits for the child to exit after SIGTERM, and fails the test
// unless it exited with status 0 within timeout.
func (c *Child) WaitStopped(timeout time.Duration) {
	c.t.Helper()
	select {
	case <-c.exited:
	case <-time.After(timeout):
		c.t.Fatalf("child %s (pid %d) did not stop within %v of SIGTERM; its log ends:\n%s", c.ID, c.PID(), timeout, Tail(c.Log(), 4000))
	}
	if c.err != nil {
		c.t.Fatalf("child %s did not stop gracefully on SIGTERM: %v; its log ends:\n%s", c.ID, c.err, Tail(c.Log(), 4000))
	}
}

// Context is for the child's main: it returns a context that ends on
// SIGTERM or an interrupt, and exits the process (status 3) as soon as
// stdin reaches EOF — the parent holds its write end, so EOF means the
// parent died (a test that panicked or timed out), and a runner must not
// outlive it.
func Context(logger *slog.Logger) (context.Context, context.CancelFunc) {
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		logger.Error("child: stdin closed, the parent is gone; exiting")
		os.Exit(3)
	}()
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
}

// Pool opens a small pool on url whose every connection (a runner's lock
// connections included) carries instance as its application_name, so that
// the parent can tell whose session holds a lock.
func Pool(ctx context.Context, url, instance string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = instance
	cfg.MaxConns = 4
	return pgxpool.NewWithConfig(ctx, cfg)
}

// Tail returns the last n bytes of s, from a line start where possible.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "[...]\n" + s
}

// syncBuffer is a bytes.Buffer safe for the writes of exec's copying
// goroutines and the reads of the test.
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
