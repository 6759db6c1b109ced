package childproc

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Freeze stops the child with SIGSTOP, as a paused container or a debugger
// stops a service, and returns when every thread of it is stopped, with
// the time the signal was sent and a function that resumes it (SIGCONT;
// called again, it does nothing; the test's end calls it too).
//
// kill(2) returns once the signal is pending, not once the process has
// stopped: the thread the kernel picks to take it must first be scheduled,
// and meanwhile the child's other threads go on running. On a loaded
// machine that was long enough for a frozen runner to read and start
// handling events appended after the signal was sent. Freeze waits for
// /proc to show every thread stopped, and fails the test if that takes
// longer than 10 s.
func (c *Child) Freeze() (sent time.Time, resume func()) {
	c.t.Helper()
	pid := c.PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		c.t.Fatalf("SIGSTOP child %s: %v (%s)", c.ID, err, c.State())
	}
	sent = time.Now()
	var once sync.Once
	resume = func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	c.t.Cleanup(resume)
	deadline := time.Now().Add(10 * time.Second)
	for {
		running, err := runningThreads(pid)
		if err == nil && running == 0 {
			return sent, resume
		}
		if !c.Alive() {
			c.t.Fatalf("child %s exited while being stopped: %s", c.ID, c.State())
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("child %s (pid %d): %d thread(s) not stopped 10s after SIGSTOP (%v)", c.ID, pid, running, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// runningThreads counts the threads of process pid that are not stopped
// (state T, or t when traced, in /proc/PID/task/TID/stat).
func runningThreads(pid int) (int, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return -1, err
	}
	running := 0
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if err != nil {
			if os.IsNotExist(err) {
				continue // the thread exited
			}
			return -1, err
		}
		// "tid (comm) S ...": comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) {
			return -1, os.ErrInvalid
		}
		if st := s[i+2]; st != 'T' && st != 't' {
			running++
		}
	}
	return running, nil
}
