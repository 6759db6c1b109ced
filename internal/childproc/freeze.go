package childproc

import (
	"errors"
	"io/fs"
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
	// Through os.Process (a pidfd): never a process that reused the pid.
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		c.t.Fatalf("SIGSTOP child %s: %v (%s)", c.ID, err, c.State())
	}
	sent = time.Now()
	var once sync.Once
	resume = func() { once.Do(func() { _ = c.cmd.Process.Signal(syscall.SIGCONT) }) }
	c.t.Cleanup(resume)
	deadline := time.Now().Add(10 * time.Second)
	for {
		running, stopped, err := threadStates(pid)
		if !c.Alive() {
			c.t.Fatalf("child %s exited while being stopped: %s", c.ID, c.State())
		}
		if err == nil && running == 0 && stopped > 0 {
			return sent, resume
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("child %s (pid %d): %d thread(s) running, %d stopped 10s after SIGSTOP (/proc: %v)", c.ID, pid, running, stopped, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// threadStates counts the threads of process pid that run (or may: any
// state but stopped, zombie or dead) and those stopped (state T, or t when
// traced), from /proc/PID/task/TID/stat. A thread that exits meanwhile is
// not counted.
func threadStates(pid int) (running, stopped int, err error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
				continue // the thread exited
			}
			return 0, 0, err
		}
		switch threadState(string(b)) {
		case 'T', 't':
			stopped++
		case 'Z', 'X':
		case 0:
			return 0, 0, errors.New("childproc: unexpected " + filepath.Join(dir, task.Name(), "stat"))
		default:
			running++
		}
	}
	return running, stopped, nil
}

// threadState is the state letter of a /proc/PID/task/TID/stat line,
// "tid (comm) S ..." (comm may hold spaces and parentheses), or 0 when
// the line has none.
func threadState(stat string) byte {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) || stat[i+1] != ' ' {
		return 0
	}
	return stat[i+2]
}
