package pgcluster

import (
	"bytes"
	"os"
	"strconv"
	"syscall"

	"github.com/annals-dev/annals/internal/procstat"
)

// setDeathSignal makes the kernel send sig to the child when the thread that
// started it exits. Go keeps its threads alive (except those of goroutines
// that exit while locked with runtime.LockOSThread), so in practice this
// fires when the Go process dies.
func setDeathSignal(a *syscall.SysProcAttr, sig syscall.Signal) { a.Pdeathsig = sig }

// zombie reports whether pid has exited but not been reaped (its parent died
// and the init of this PID namespace does not reap orphans).
func zombie(pid int) bool {
	st, err := procstat.ReadStat(pid)
	return err == nil && st.State == 'Z'
}

// groupAlive reports whether a process of process group pgid is still
// running (zombies aside): after SIGKILL to a group, its members die
// asynchronously, and a PostgreSQL started before the last backend is gone
// finds its old shared memory still attached and refuses to start.
func groupAlive(pgid int) bool {
	pids, err := procstat.PIDs()
	if err != nil {
		return false
	}
	for _, pid := range pids {
		if st, err := procstat.ReadStat(pid); err == nil && st.PGRP == pgid && st.State != 'Z' {
			return true
		}
	}
	return false
}

// shmAttached reports whether the System V shared memory segment shmid
// exists and some process is attached to it (/proc/sysvipc/shm). PostgreSQL
// refuses to start while the segment its postmaster.pid names is attached.
func shmAttached(shmid int) bool {
	b, err := os.ReadFile("/proc/sysvipc/shm")
	if err != nil {
		return false
	}
	for _, line := range bytes.Split(b, []byte("\n"))[1:] {
		// key shmid perms size cpid lpid nattch ...
		f := bytes.Fields(line)
		if len(f) < 7 {
			continue
		}
		if id, err := strconv.Atoi(string(f[1])); err != nil || id != shmid {
			continue
		}
		n, err := strconv.Atoi(string(f[6]))
		return err == nil && n > 0
	}
	return false
}
