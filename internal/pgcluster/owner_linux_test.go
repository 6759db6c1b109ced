package pgcluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestServerDiesWithOwner kills a process that started a cluster and checks
// that the kernel stops the server (parent-death signal) and that the next
// Start reaps the directory left behind.
func TestServerDiesWithOwner(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var pid int
	var dir string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if n, _ := fmt.Sscanf(sc.Text(), "POSTMASTER %d %s", &pid, &dir); n == 2 {
			break
		}
	}
	if pid == 0 {
		t.Fatal("helper did not report its cluster")
	}
	go func() { _, _ = bufio.NewReader(out).WriteTo(os.Stdout) }()
	if !alive(pid) {
		t.Fatalf("postmaster %d is not running", pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitUntil(t, 30*time.Second, "postmaster "+strconv.Itoa(pid)+" exits after its owner died", func() bool { return !alive(pid) })
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the dead owner's directory %s is already gone: %v", dir, err)
	}
	// The postmaster's children can outlive it by a moment on a loaded
	// machine (they hold the owner file's lock until they exit), so the
	// directory becomes reapable shortly after, not necessarily at once.
	waitUntil(t, 30*time.Second, "reapStale removes "+dir, func() bool {
		reapStale(testLogger(t))
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	})
}

// runHelperOwner is the process killed by TestServerDiesWithOwner: it starts
// a cluster, reports the postmaster's pid and directory, and waits.
func runHelperOwner() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Start(ctx, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	c.mu.Lock()
	pid := c.proc.cmd.Process.Pid
	c.mu.Unlock()
	fmt.Printf("POSTMASTER %d %s\n", pid, filepath.Dir(c.DataDir()))
	<-ctx.Done() // killed long before
	_ = c.Stop(context.Background())
	os.Exit(1)
}
