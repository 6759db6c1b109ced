package procstat

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
)

// userHZ is the unit of the times in /proc/PID/stat: USER_HZ, 100 on Linux
// whatever the kernel's tick rate.
const userHZ = 100

// Querier is what FindServer needs of a connection or pool.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Server reads the CPU time of a PostgreSQL server running on this machine.
type Server struct {
	postmaster int
}

// errNotLocal is why FindServer finds no server it can read.
const errNotLocal = "the server does not run on this machine, or its processes cannot be read here"

// FindServer returns the server behind q when its processes can be read
// here; otherwise nil and why not. The backend that answers must be a child
// of a process whose command line names the server's data directory, so a
// remote server whose backend PID happens to exist here is not taken for a
// local one. Reading the data directory needs superuser or
// pg_read_all_settings.
func FindServer(ctx context.Context, q Querier) (*Server, string) {
	var pid int
	var dataDir string
	if err := q.QueryRow(ctx, "SELECT pg_backend_pid(), current_setting('data_directory')").Scan(&pid, &dataDir); err != nil {
		return nil, "the server's data directory cannot be read (it needs superuser or pg_read_all_settings)"
	}
	st, err := ReadStat(pid)
	if err != nil {
		return nil, errNotLocal
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(st.PPID) + "/cmdline")
	if err != nil || dataDir == "" || !bytes.Contains(cmdline, []byte(dataDir)) {
		return nil, errNotLocal
	}
	return &Server{postmaster: st.PPID}, ""
}

// Total is the CPU time the server has used so far (see the package
// documentation for what it covers).
func (s *Server) Total() (time.Duration, error) {
	pm, err := ReadStat(s.postmaster)
	if err != nil {
		return 0, errors.Wrap(err, "procstat: read the postmaster's CPU time")
	}
	sum := runTime(s.postmaster, pm.CPU) + pm.ChildrenCPU
	pids, err := PIDs()
	if err != nil {
		return 0, err
	}
	for _, pid := range pids {
		if pid == s.postmaster {
			continue
		}
		st, err := ReadStat(pid)
		if err != nil || st.PPID != s.postmaster {
			continue // gone since the listing, or not the server's
		}
		sum += runTime(pid, st.CPU)
	}
	return sum, nil
}

// runTime is the CPU time process pid has used: from /proc/PID/schedstat,
// in nanoseconds, when the kernel keeps it; else ticks, the time stat gave.
// A backend that used less than a tick between two readings would
// otherwise seem to have used nothing, or a whole tick.
func runTime(pid int, ticks time.Duration) time.Duration {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
	if err != nil {
		return ticks
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return ticks
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return ticks
	}
	return time.Duration(ns)
}

// Self is the CPU time (user and system) this process has used; 0 if it
// cannot be read.
func Self() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Stat is what ReadStat reads of /proc/PID/stat.
type Stat struct {
	// State is the process's state letter ('R', 'S', 'Z' for a zombie, …).
	State byte
	// PPID is its parent's PID, PGRP its process group.
	PPID, PGRP int
	// CPU is the CPU time it has used (utime + stime), ChildrenCPU the time
	// its ended children used that it waited for (cutime + cstime), both
	// in USER_HZ ticks.
	CPU, ChildrenCPU time.Duration
}

// ReadStat parses /proc/PID/stat. The command name (field 2) is in
// parentheses and may contain spaces and parentheses, so fields are counted
// after its last closing parenthesis.
func ReadStat(pid int) (Stat, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	end := bytes.LastIndexByte(raw, ')')
	if end < 0 {
		return Stat{}, errors.Newf("procstat: malformed /proc/%d/stat", pid)
	}
	// After the name: state(3) ppid(4) pgrp(5) ... utime(14) stime(15)
	// cutime(16) cstime(17).
	f := strings.Fields(string(raw[end+1:]))
	if len(f) < 15 || len(f[0]) != 1 {
		return Stat{}, errors.Newf("procstat: short /proc/%d/stat", pid)
	}
	num := func(i int) int64 { n, _ := strconv.ParseInt(f[i], 10, 64); return n }
	ticks := func(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }
	return Stat{
		State:       f[0][0],
		PPID:        int(num(1)),
		PGRP:        int(num(2)),
		CPU:         ticks(num(11) + num(12)),
		ChildrenCPU: ticks(num(13) + num(14)),
	}, nil
}

// PIDs lists the processes in /proc.
func PIDs() ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, errors.Wrap(err, "procstat: list processes")
	}
	pids := make([]int, 0, len(entries))
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
