package pgcluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/internal/errmark"
)

// ErrStopped is returned by [Cluster.Restart] after [Cluster.Stop].
var ErrStopped = errors.New("pgcluster: cluster is stopped")

// Options configures [Start]. A nil *Options means defaults.
type Options struct {
	// Fsync keeps PostgreSQL's durability settings. When false, the server
	// runs with fsync, synchronous_commit and full_page_writes off and initdb
	// skips its final sync: fast, and fine for throwaway test data, but
	// meaningless for benchmarks of commit latency.
	// Defaults to false.
	Fsync bool
	// Port is the TCP port the server listens on, on 127.0.0.1.
	// Defaults to 0: a free port picked by the operating system.
	Port int
	// Logger receives a line when the server starts, restarts and stops.
	// Defaults to a logger that discards everything.
	Logger *slog.Logger
	// Settings are extra server settings, passed as -c name=value after the
	// ones pgcluster sets, so they override them.
	// Defaults to none.
	Settings map[string]string
	// BinDir is the directory that holds initdb and postgres.
	// Defaults to [FindBinaries].
	BinDir string
}

// Cluster is a running throwaway PostgreSQL server. Its methods are safe for
// concurrent use.
type Cluster struct {
	binDir  string
	dir     string // temporary directory: data/, the log, the socket, the owner lock
	dataDir string
	logPath string
	port    int
	portSet bool // the caller chose the port; do not pick another on a bind failure
	fsync   bool
	extra   []string // -c name=value arguments from Options.Settings, sorted
	user    *osUser
	logger  *slog.Logger
	owner   *os.File // flocked for the cluster's life; see reapStale

	mu      sync.Mutex
	proc    *process // nil while the server is down
	stopped bool
	stopErr error
}

// osUser is the OS account the server runs as when the process is root.
type osUser struct {
	name     string
	uid, gid uint32
}

// process is one run of the postgres binary.
type process struct {
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when cmd.Wait returns
	err  error         // cmd.Wait's result; read after done is closed
}

const (
	dirPrefix       = "annals-pgcluster-"
	ownerFile       = "owner.lock"
	logFile         = "postgres.log"
	defaultReadyFor = 60 * time.Second // startup bound when ctx has no deadline
	fastStopFor     = 30 * time.Second // SIGINT (fast shutdown) before SIGQUIT
	quitStopFor     = 5 * time.Second  // SIGQUIT (immediate shutdown) before SIGKILL
	bindRetries     = 5
	maxSocketPath   = 100 // sun_path is 104 to 108 bytes depending on the OS
)

// Start creates a fresh cluster in a temporary directory and starts it. It
// returns once the server accepts connections, or fails with the tail of the
// server log. ctx bounds the startup; without a deadline, 60 seconds.
func Start(ctx context.Context, opts *Options) (*Cluster, error) {
	if !supported {
		return nil, errors.Newf("pgcluster: not supported on %s", runtime.GOOS)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Port < 0 || o.Port > 65535 {
		return nil, errors.Newf("pgcluster: port %d is out of range", o.Port)
	}
	if o.BinDir == "" {
		dir, err := FindBinaries()
		if err != nil {
			return nil, err
		}
		o.BinDir = dir
	} else if !hasServerBinaries(o.BinDir) {
		return nil, errmark.Mark(errors.Newf("pgcluster: %s does not hold both initdb and postgres", o.BinDir), ErrNoBinaries)
	}
	u, err := serverUser()
	if err != nil {
		return nil, err
	}
	reapStale(o.Logger)

	c := &Cluster{
		binDir:  o.BinDir,
		port:    o.Port,
		portSet: o.Port != 0,
		fsync:   o.Fsync,
		user:    u,
		logger:  o.Logger,
	}
	keys := make([]string, 0, len(o.Settings))
	for k := range o.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		c.extra = append(c.extra, "-c", k+"="+o.Settings[k])
	}
	if err := c.create(ctx); err != nil {
		return nil, errors.CombineErrors(err, c.cleanup())
	}
	start := time.Now()
	if err := c.startWithPortRetry(ctx); err != nil {
		return nil, errors.CombineErrors(err, c.cleanup())
	}
	c.logger.InfoContext(ctx, "pgcluster: started",
		slog.String("url", c.URL()), slog.String("dir", c.dir), slog.Bool("fsync", c.fsync),
		slog.Duration("took", time.Since(start)))
	return c, nil
}

// create makes the temporary directory, takes the owner lock and runs initdb.
func (c *Cluster) create(ctx context.Context) error {
	if err := c.makeDir(); err != nil {
		return err
	}
	args := []string{"-D", c.dataDir, "--auth=trust", "-U", "postgres", "-E", "UTF8", "--locale=C"}
	if !c.fsync {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "initdb"), args...)
	cmd.Dir = c.dir
	cmd.Env = childEnv()
	cmd.SysProcAttr = procAttr(c.user, syscall.SIGKILL)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return errors.Wrapf(err, "pgcluster: initdb failed:\n%s", tail(string(out), 30))
	}
	c.logger.DebugContext(ctx, "pgcluster: initdb done", slog.Duration("took", time.Since(start)))
	return nil
}

// makeDir makes the temporary directory and takes the owner lock.
func (c *Cluster) makeDir() error {
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return errors.Wrap(err, "pgcluster: create temporary directory")
	}
	// Absolute: initdb and postgres run in dir, so a relative TMPDIR would
	// put the data directory inside itself, and the server reports its data
	// directory absolute (isOurs).
	if dir, err = filepath.Abs(dir); err != nil {
		return errors.Wrap(err, "pgcluster: temporary directory")
	}
	c.dir = dir
	c.dataDir = filepath.Join(dir, "data")
	c.logPath = filepath.Join(dir, logFile)
	// The owner file is locked under another name and then renamed, so that
	// reapStale never finds it unlocked.
	tmpOwner := filepath.Join(dir, ownerFile+".new")
	c.owner, err = os.OpenFile(tmpOwner, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return errors.Wrap(err, "pgcluster: create owner lock file")
	}
	if ok, err := tryLock(c.owner); err != nil {
		return errors.Wrapf(err, "pgcluster: lock %s", tmpOwner)
	} else if !ok {
		return errors.Newf("pgcluster: %s is locked by another process", tmpOwner)
	}
	if _, err := fmt.Fprintf(c.owner, "%d\n", os.Getpid()); err != nil {
		return errors.Wrap(err, "pgcluster: write owner lock file")
	}
	if err := os.Rename(tmpOwner, filepath.Join(dir, ownerFile)); err != nil {
		return errors.Wrap(err, "pgcluster: publish owner lock file")
	}
	return chown(dir, c.user)
}

// startWithPortRetry starts the server, picking another free port when the
// one picked was taken in the meantime by someone else.
func (c *Cluster) startWithPortRetry(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		if !c.portSet {
			p, err := freePort()
			if err != nil {
				return err
			}
			c.port = p
		}
		err := c.startServer(ctx)
		if err == nil || c.portSet || attempt == bindRetries || !errors.Is(err, errAddrInUse) {
			return err
		}
		c.logger.DebugContext(ctx, "pgcluster: port taken, picking another", slog.Int("port", c.port))
	}
}

var errAddrInUse = errors.New("address already in use")

// serverArgs is the postgres command line.
func (c *Cluster) serverArgs() []string {
	socketDir := c.dir
	if len(socketDir)+len("/.s.PGSQL.65535") > maxSocketPath {
		socketDir = "" // no Unix socket rather than a path the kernel refuses
	}
	args := []string{
		"-D", c.dataDir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "port=" + strconv.Itoa(c.port),
		"-c", "unix_socket_directories=" + socketDir,
		"-c", "wal_level=logical",
		"-c", "max_connections=300",
		// Logical replication slots and walsenders (package walsource, one
		// per subscriber partition that follows the WAL): PostgreSQL's
		// default of 10 is short for parallel tests.
		"-c", "max_wal_senders=64",
		"-c", "max_replication_slots=64",
	}
	if !c.fsync {
		args = append(args,
			"-c", "fsync=off",
			"-c", "synchronous_commit=off",
			"-c", "full_page_writes=off")
	}
	return append(args, c.extra...)
}

// startServer runs postgres and waits until it accepts connections. The
// caller holds c.mu or owns c exclusively.
func (c *Cluster) startServer(ctx context.Context) error {
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return errors.Wrap(err, "pgcluster: open server log")
	}
	logStart, _ := logf.Seek(0, io.SeekEnd)
	cmd := exec.Command(filepath.Join(c.binDir, "postgres"), c.serverArgs()...)
	cmd.Dir = c.dir
	cmd.Env = childEnv()
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = procAttr(c.user, syscall.SIGQUIT)
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return errors.Wrap(err, "pgcluster: start postgres")
	}
	p := &process{cmd: cmd, log: logf, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := c.waitReady(ctx, p); err != nil {
		c.kill(p)
		logTail := c.logSince(logStart)
		err = errors.Newf("pgcluster: postgres on port %d did not become ready: %w\nserver log:\n%s",
			c.port, err, logTail)
		if strings.Contains(logTail, "could not bind") || strings.Contains(logTail, "Address already in use") {
			err = errmark.Mark(err, errAddrInUse)
		}
		return err
	}
	c.proc = p
	return nil
}

// waitReady polls until the server accepts a connection, the process exits,
// or the startup deadline passes.
func (c *Cluster) waitReady(ctx context.Context, p *process) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultReadyFor)
		defer cancel()
	}
	// A connection attempt must not outlive the process: the port may belong
	// to someone else who accepts and never answers.
	procCtx, cancelProc := context.WithCancel(ctx)
	defer cancelProc()
	go func() {
		select {
		case <-p.done:
			cancelProc()
		case <-procCtx.Done():
		}
	}()
	delay := 5 * time.Millisecond
	var lastErr error
	for {
		attemptCtx, cancel := context.WithTimeout(procCtx, 2*time.Second)
		conn, err := pgx.Connect(attemptCtx, c.URL())
		if err == nil {
			err = c.isOurs(attemptCtx, conn)
			_ = conn.Close(attemptCtx)
		}
		cancel()
		if err == nil {
			return nil
		}
		lastErr = err
		timer := time.NewTimer(delay)
		select {
		case <-p.done:
			timer.Stop()
			return errors.Wrapf(p.err, "postgres exited during startup")
		case <-ctx.Done():
			timer.Stop()
			return errors.Wrapf(lastErr, "waiting for postgres: %v", ctx.Err())
		case <-timer.C:
		}
		delay = min(delay*2, 100*time.Millisecond)
	}
}

// isOurs reports, as an error, when the server conn reached is not the one
// in c's data directory: another server listening on the port answers
// before this one has failed to bind it (it then exits, and the startup
// fails with errAddrInUse instead of handing out someone else's server).
func (c *Cluster) isOurs(ctx context.Context, conn *pgx.Conn) error {
	var dir string
	if err := conn.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dir); err != nil {
		return errors.Wrap(err, "read the server's data directory")
	}
	if sameDir(dir, c.dataDir) {
		return nil
	}
	return errors.Newf("port %d is answered by another server (data directory %s)", c.port, dir)
}

// sameDir reports whether a and b name the same directory, following
// symbolic links (a temporary directory may be reached through one).
func sameDir(a, b string) bool {
	if a == b {
		return true
	}
	resolve := func(p string) (string, error) {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		return filepath.EvalSymlinks(abs)
	}
	ra, errA := resolve(a)
	rb, errB := resolve(b)
	return errA == nil && errB == nil && ra == rb
}

// URL returns the connection URL of the server's "postgres" database, as
// superuser "postgres" over TCP.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port returns the TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// DataDir returns the server's data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// LogPath returns the file that receives the server's log.
func (c *Cluster) LogPath() string { return c.logPath }

// Restart stops the server (fast shutdown) and starts it again on the same
// data directory and port. It returns [ErrStopped] after [Cluster.Stop].
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrStopped
	}
	start := time.Now()
	c.stopServer(ctx)
	if err := c.startServer(ctx); err != nil {
		return err
	}
	c.logger.InfoContext(ctx, "pgcluster: restarted", slog.String("url", c.URL()), slog.Duration("took", time.Since(start)))
	return nil
}

// Down stops the server (fast shutdown) and leaves it stopped, its data
// directory kept: connections are refused until [Cluster.Up]. It returns
// [ErrStopped] after [Cluster.Stop].
func (c *Cluster) Down(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrStopped
	}
	c.stopServer(ctx)
	return nil
}

// Crash kills the server and all its processes at once (SIGKILL to its
// process group), as a power cut would leave it but for the operating
// system's cache: no shutdown checkpoint, and WAL still in PostgreSQL's
// buffers is lost. The data directory is kept; [Cluster.Up] starts the
// server again, which then runs crash recovery. It returns [ErrStopped]
// after [Cluster.Stop].
func (c *Cluster) Crash(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrStopped
	}
	p := c.proc
	if p == nil {
		return nil
	}
	shmid := c.shmID()
	// ESRCH: the group is gone already (the server died on its own).
	if err := signalGroup(p.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return errors.Wrap(err, "pgcluster: crash")
	}
	c.proc = nil
	<-p.done
	_ = p.log.Close()
	// The backends die asynchronously; wait for them (or ctx), so that Up
	// does not find the old shared memory still in use: for the process
	// group to be gone, and for the segment postmaster.pid names to have no
	// process attached (the group alone once let Up start too early).
	for deadline := time.Now().Add(10 * time.Second); (groupAlive(p.cmd.Process.Pid) || (shmid >= 0 && shmAttached(shmid))) &&
		time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(5 * time.Millisecond)
	}
	c.logger.InfoContext(ctx, "pgcluster: crashed", slog.String("dir", c.dir))
	return nil
}

// shmID returns the System V shared memory ID the running server's
// postmaster.pid names (its 7th line: key and ID), or -1.
func (c *Cluster) shmID() int {
	b, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return -1
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 7 {
		return -1
	}
	f := strings.Fields(lines[6])
	if len(f) != 2 {
		return -1
	}
	id, err := strconv.Atoi(f[1])
	if err != nil {
		return -1
	}
	return id
}

// Up starts the server again after [Cluster.Down] or [Cluster.Crash], on the same data directory
// and port, and returns once it accepts connections (within the 100 ms of
// its readiness polling). A server already up is left alone.
func (c *Cluster) Up(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrStopped
	}
	if c.proc != nil {
		return nil
	}
	return c.startServer(ctx)
}

// Stop shuts the server down and removes its directory. It asks for a fast
// shutdown (SIGINT) and, if the server has not exited when ctx ends or after
// 30 seconds, an immediate one (SIGQUIT), then kills the process group. Stop
// is safe to call more than once and from several goroutines; later calls
// return the first one's result.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return c.stopErr
	}
	c.stopped = true
	start := time.Now()
	c.stopServer(ctx)
	c.stopErr = c.cleanup()
	c.logger.InfoContext(ctx, "pgcluster: stopped", slog.String("dir", c.dir), slog.Duration("took", time.Since(start)))
	return c.stopErr
}

// stopServer stops the running server, if any. It does not fail: a server
// that ignores SIGINT and SIGQUIT is killed.
func (c *Cluster) stopServer(ctx context.Context) {
	p := c.proc
	if p == nil {
		return
	}
	c.proc = nil
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	t := time.NewTimer(fastStopFor)
	defer t.Stop()
	select {
	case <-p.done:
		_ = p.log.Close()
		return
	case <-ctx.Done():
	case <-t.C:
	}
	c.logger.WarnContext(ctx, "pgcluster: fast shutdown did not finish; forcing an immediate one", slog.String("dir", c.dir))
	c.kill(p)
}

// kill stops p with SIGQUIT, then SIGKILL for its whole process group, and
// waits for it.
func (c *Cluster) kill(p *process) {
	defer func() { _ = p.log.Close() }()
	_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
		return
	case <-time.After(quitStopFor):
	}
	_ = signalGroup(p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// cleanup removes the directory and releases the owner lock.
func (c *Cluster) cleanup() error {
	var err error
	if c.dir != "" {
		err = errors.Wrapf(os.RemoveAll(c.dir), "pgcluster: remove %s", c.dir)
	}
	if c.owner != nil {
		_ = c.owner.Close()
	}
	return err
}

// logSince returns the last lines the server logged after offset.
func (c *Cluster) logSince(offset int64) string {
	f, err := os.Open(c.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer func() { _ = f.Close() }()
	const maxTail = 8 << 10
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > maxTail {
		offset = fi.Size() - maxTail
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return "(no log: " + err.Error() + ")"
	}
	b, _ := io.ReadAll(f)
	return tail(string(b), 30)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, errors.Wrap(err, "pgcluster: pick a free port")
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// childEnv is the environment of initdb and postgres: ours without the PG*
// variables that would redirect them, in the C locale so messages are English.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C", "LANG=C")
}
