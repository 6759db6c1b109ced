package proccpu

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
	st, err := readStat(pid)
	if err != nil {
		return nil, errNotLocal
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(st.ppid) + "/cmdline")
	if err != nil || dataDir == "" || !bytes.Contains(cmdline, []byte(dataDir)) {
		return nil, errNotLocal
	}
	return &Server{postmaster: st.ppid}, ""
}

// Total is the CPU time the server has used so far (see the package
// documentation for what it covers).
func (s *Server) Total() (time.Duration, error) {
	pm, err := readStat(s.postmaster)
	if err != nil {
		return 0, errors.Wrap(err, "proccpu: read the postmaster's CPU time")
	}
	sum := runTime(s.postmaster, pm.self) + pm.children
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, errors.Wrap(err, "proccpu: list processes")
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == s.postmaster {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.ppid != s.postmaster {
			continue // gone since the listing, or not the server's
		}
		sum += runTime(pid, st.self)
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

// procStat is what Total needs of /proc/PID/stat.
type procStat struct {
	ppid     int
	self     time.Duration // utime + stime
	children time.Duration // cutime + cstime: ended children it waited for
}

// readStat parses /proc/PID/stat. The command name (field 2) is in
// parentheses and may contain spaces, so fields are counted after its last
// closing parenthesis.
func readStat(pid int) (procStat, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	end := bytes.LastIndexByte(raw, ')')
	if end < 0 {
		return procStat{}, errors.Newf("proccpu: malformed /proc/%d/stat", pid)
	}
	// After the name: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17).
	f := strings.Fields(string(raw[end+1:]))
	if len(f) < 15 {
		return procStat{}, errors.Newf("proccpu: short /proc/%d/stat", pid)
	}
	num := func(i int) int64 { n, _ := strconv.ParseInt(f[i], 10, 64); return n }
	ticks := func(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }
	return procStat{
		ppid:     int(num(1)),
		self:     ticks(num(11) + num(12)),
		children: ticks(num(13) + num(14)),
	}, nil
}
