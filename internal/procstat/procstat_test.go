package procstat

import (
	"os"
	"os/exec"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"
)

// ReadStat parses this process's own /proc entry: its parent is the parent
// the runtime reports, and its CPU time grows with work done.
func TestReadStat(t *testing.T) {
	before, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if before.PPID != os.Getppid() {
		t.Fatalf("ppid %d, want %d", before.PPID, os.Getppid())
	}
	deadline := time.Now().Add(10 * time.Second)
	x := 0
	for {
		for i := range 10_000_000 {
			x ^= i
		}
		after, err := ReadStat(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if after.CPU > before.CPU {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time did not grow in 10 s of work (%d): %v", x, after.CPU)
		}
	}
	if before.PGRP != syscall.Getpgrp() {
		t.Fatalf("process group %d, want %d", before.PGRP, syscall.Getpgrp())
	}
	// A process's state is its main thread's, which may be asleep while
	// this goroutine runs on another thread (CI saw 'S'): the thread that
	// reads its own entry (/proc/TID/stat) is the one sure to be running.
	runtime.LockOSThread()
	self, err := ReadStat(syscall.Gettid())
	runtime.UnlockOSThread()
	if err != nil || self.State != 'R' || self.PGRP != syscall.Getpgrp() {
		t.Fatalf("this thread: state %q, process group %d (%v); want 'R', %d", self.State, self.PGRP, err, syscall.Getpgrp())
	}
	// A child that worked, ended and was waited for counts in ChildrenCPU.
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if after, err := ReadStat(os.Getpid()); err != nil || after.ChildrenCPU <= before.ChildrenCPU {
		t.Fatalf("children's CPU %v after %v (%v)", after.ChildrenCPU, before.ChildrenCPU, err)
	}
	pids, err := PIDs()
	if err != nil || !slices.Contains(pids, os.Getpid()) {
		t.Fatalf("PIDs does not list this process (%v)", err)
	}
	if _, err := ReadStat(-1); err == nil {
		t.Fatal("ReadStat(-1) succeeded")
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
