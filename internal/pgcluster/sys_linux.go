package pgcluster

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// setDeathSignal makes the kernel send sig to the child when the thread that
// started it exits. Go keeps its threads alive (except those of goroutines
// that exit while locked with runtime.LockOSThread), so in practice this
// fires when the Go process dies.
func setDeathSignal(a *syscall.SysProcAttr, sig syscall.Signal) { a.Pdeathsig = sig }

// zombie reports whether pid has exited but not been reaped (its parent died
// and the init of this PID namespace does not reap orphans).
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may
	// itself hold spaces or parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}
