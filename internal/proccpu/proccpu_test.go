package proccpu

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
)

// readStat parses this process's own /proc entry: its parent is the parent
// the runtime reports, and its CPU time grows with work done.
func TestReadStat(t *testing.T) {
	before, err := readStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if before.ppid != os.Getppid() {
		t.Fatalf("ppid %d, want %d", before.ppid, os.Getppid())
	}
	deadline := time.Now().Add(10 * time.Second)
	x := 0
	for {
		for i := range 10_000_000 {
			x ^= i
		}
		after, err := readStat(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if after.self > before.self {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time did not grow in 10 s of work (%d): %v", x, after.self)
		}
	}
	// A child that ended and was waited for counts in children.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if after, err := readStat(os.Getpid()); err != nil || after.children < before.children {
		t.Fatalf("children %v after %v (%v)", after.children, before.children, err)
	}
	if _, err := readStat(-1); err == nil {
		t.Fatal("readStat(-1) succeeded")
	}
}

// FindServer finds a server that runs on this machine (the test clusters
// do), and its CPU time grows while it works.
func TestServerCPU(t *testing.T) {
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	srv, why := FindServer(ctx, db.Pool)
	if srv == nil {
		t.Fatalf("the test cluster's server was not found: %s", why)
	}
	before, err := srv.Total()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		// About 100 ms of server CPU time.
		if _, err := db.Pool.Exec(ctx, "SELECT count(*) FROM generate_series(1, 1000000)"); err != nil {
			t.Fatal(err)
		}
		after, err := srv.Total()
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server's CPU time did not grow: %v", after)
		}
	}
}

// Self grows with work done.
func TestSelf(t *testing.T) {
	before := Self()
	deadline := time.Now().Add(10 * time.Second)
	x := 0
	for Self() <= before {
		for i := range 10_000_000 {
			x ^= i
		}
		if time.Now().After(deadline) {
			t.Fatalf("Self did not grow in 10 s of work (%d)", x)
		}
	}
}

// runTime reads a process's run time in nanoseconds, and falls back to the
// ticks it is given when schedstat cannot be read.
func TestRunTime(t *testing.T) {
	if got := runTime(-1, 5*time.Second); got != 5*time.Second {
		t.Fatalf("runTime of no process: %v, want the fallback", got)
	}
	if _, err := os.Stat("/proc/self/schedstat"); err != nil {
		t.Fatalf("this kernel keeps no schedstat: %v", err)
	}
	if got := runTime(os.Getpid(), 0); got <= 0 {
		t.Fatalf("runTime of this process: %v", got)
	}
}
