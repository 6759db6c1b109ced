package pgcluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/internal/errmark"
)

// ErrNoPgBouncer is matched by StartPgBouncer's error when no pgbouncer
// binary is found.
var ErrNoPgBouncer = errors.New("pgcluster: no pgbouncer binary found")

// LockSessionParameters are the start-up parameters every lock session of
// package advisorylock sends, which PgBouncer refuses unless they are in
// PgBouncerOptions.IgnoreStartupParameters.
var LockSessionParameters = []string{"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
	"tcp_user_timeout", "client_connection_check_interval"}

// PgBouncerOptions configure StartPgBouncer.
type PgBouncerOptions struct {
	// PoolMode is PgBouncer's pool_mode: "transaction" (the default),
	// "session" or "statement".
	PoolMode string
	// PoolSize is default_pool_size, the server connections per database
	// and user (default 2: fewer than the clients, so that clients share
	// server sessions, which is what a test of transaction pooling needs).
	PoolSize int
	// IgnoreStartupParameters are start-up parameters PgBouncer accepts
	// from clients and drops (ignore_startup_parameters), besides
	// extra_float_digits; by default it refuses any it does not track.
	IgnoreStartupParameters []string
	// Users are the roles that may log in through the pooler, besides
	// "postgres" (auth_type trust still wants each name in its auth_file).
	Users []string
	// Logger receives start and stop messages (default: discarded).
	Logger *slog.Logger

	pickPort func() (int, error) // freePort; a test's picks
}

// PgBouncer is a running PgBouncer in front of one PostgreSQL server, a child
// of this process (as the Cluster's server is: its own process group, a
// parent-death signal, the "postgres" OS user when we are root, since
// PgBouncer refuses to run as root). Stop it with Stop.
type PgBouncer struct {
	dir    string
	port   int
	proc   *process
	logger *slog.Logger
}

// FindPgBouncer returns the pgbouncer binary: $ANNALS_PGBOUNCER, else
// pgbouncer on PATH, else /usr/sbin/pgbouncer (Debian's package puts it
// there, outside a normal user's PATH).
func FindPgBouncer() (string, error) {
	if p := os.Getenv("ANNALS_PGBOUNCER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/pgbouncer"
	if fi, err := os.Stat(debian); err == nil && !fi.IsDir() {
		return debian, nil
	}
	return "", errmark.Mark(errors.New("pgcluster: no pgbouncer binary: install PgBouncer "+
		"(Debian: apt-get install pgbouncer; `make pgbouncer` does it as root) or set ANNALS_PGBOUNCER"), ErrNoPgBouncer)
}

// StartPgBouncer starts PgBouncer on a free port of 127.0.0.1 in front of the
// server of serverURL (its host and port; every database of the server is
// served under its own name), with auth_type trust. It returns once the
// pooler answers a query. URL gives a database's URL through it.
func StartPgBouncer(ctx context.Context, serverURL string, opts *PgBouncerOptions) (*PgBouncer, error) {
	if !supported {
		return nil, errors.New("pgcluster: PgBouncer is not supported on this platform")
	}
	var o PgBouncerOptions
	if opts != nil {
		o = *opts
	}
	if o.PoolMode == "" {
		o.PoolMode = "transaction"
	}
	if o.PoolSize == 0 {
		o.PoolSize = 2
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	bin, err := FindPgBouncer()
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(serverURL)
	if err != nil {
		return nil, errors.Wrap(err, "pgcluster: parse the server URL")
	}
	u, err := serverUser()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "annals-pgbouncer-")
	if err != nil {
		return nil, errors.Wrap(err, "pgcluster: make PgBouncer's directory")
	}
	b := &PgBouncer{dir: dir, logger: o.Logger}
	fail := func(err error) (*PgBouncer, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := chown(dir, u); err != nil {
		return fail(err)
	}
	if o.pickPort == nil {
		o.pickPort = freePort
	}
	var users strings.Builder
	for _, name := range append([]string{"postgres"}, o.Users...) {
		// auth_file quotes names with double quotes, doubled inside.
		fmt.Fprintf(&users, "\"%s\" \"\"\n", strings.ReplaceAll(name, `"`, `""`))
	}
	if err := writeOwned(filepath.Join(dir, "users.txt"), users.String(), u); err != nil {
		return fail(err)
	}
	// The port picked free may be taken before PgBouncer binds it (by
	// another test's server, or an outgoing connection's local port): pick
	// another, as Cluster.Start does.
	for attempt := 1; ; attempt++ {
		if b.port, err = o.pickPort(); err != nil {
			return fail(err)
		}
		err = b.start(ctx, bin, cfg, &o, u)
		if err == nil {
			break
		}
		if attempt == bindRetries || !errors.Is(err, errAddrInUse) {
			return fail(err)
		}
		o.Logger.DebugContext(ctx, "pgcluster: PgBouncer's port taken, picking another", slog.Int("port", b.port))
	}
	o.Logger.InfoContext(ctx, "pgcluster: PgBouncer started", slog.Int("port", b.port), slog.String("pool_mode", o.PoolMode))
	return b, nil
}

// writeOwned writes body to p (0600), owned by u when not nil.
func writeOwned(p, body string, u *osUser) error {
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		return errors.Wrapf(err, "pgcluster: write %s", p)
	}
	return chown(p, u)
}

// start writes PgBouncer's configuration for b.port, starts it and waits
// until it answers. Its error is marked errAddrInUse when PgBouncer could
// not bind the port.
func (b *PgBouncer) start(ctx context.Context, bin string, cfg *pgx.ConnConfig, o *PgBouncerOptions, u *osUser) error {
	dir := b.dir
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 500
logfile = %s
pidfile = %s
admin_users = postgres
server_reset_query = DISCARD ALL
ignore_startup_parameters = %s
`, cfg.Host, cfg.Port, b.port, filepath.Join(dir, "users.txt"), o.PoolMode, o.PoolSize,
		filepath.Join(dir, "pgbouncer.log"), b.pidfile(),
		strings.Join(append([]string{"extra_float_digits"}, o.IgnoreStartupParameters...), ", "))
	if err := writeOwned(filepath.Join(dir, "pgbouncer.ini"), ini, u); err != nil {
		return err
	}
	for _, name := range []string{"pgbouncer.log", "stderr.log", "pgbouncer.pid"} {
		// A previous attempt's: its log would be read as this one's.
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !os.IsNotExist(err) {
			return errors.Wrap(err, "pgcluster: remove a previous attempt's file")
		}
	}
	logf, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return errors.Wrap(err, "pgcluster: open PgBouncer's log")
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir = dir
	cmd.Env = childEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = procAttr(u, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return errors.Wrap(err, "pgcluster: start pgbouncer")
	}
	p := &process{cmd: cmd, log: logf, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	b.proc = p
	if err := b.waitReady(ctx, cfg.Database); err != nil {
		b.stop()
		logs, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
		stderr, _ := os.ReadFile(filepath.Join(dir, "stderr.log"))
		err = errors.Newf("pgcluster: PgBouncer on port %d did not become ready: %w\nlog:\n%s%s",
			b.port, err, tail(string(logs), 20), tail(string(stderr), 10))
		if strings.Contains(string(logs)+string(stderr), "Address already in use") {
			err = errmark.Mark(err, errAddrInUse)
		}
		return err
	}
	return nil
}

// pidfile is the path of PgBouncer's pid file, which its admin console
// reports (SHOW CONFIG): how waitReady tells it from another listener.
func (b *PgBouncer) pidfile() string { return filepath.Join(b.dir, "pgbouncer.pid") }

// waitReady polls until this PgBouncer answers (its admin console reports
// its pid file: not another server or pooler that answers on the port
// before this one has failed to bind it) and a query through it succeeds,
// or the process exits, or 30 s (or ctx) pass.
func (b *PgBouncer) waitReady(ctx context.Context, database string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		err := b.isOurs(ctx)
		if err == nil {
			var conn *pgx.Conn
			if conn, err = pgx.Connect(ctx, b.URL(database, "postgres")); err == nil {
				var one int
				err = conn.QueryRow(ctx, "SELECT 1").Scan(&one)
				_ = conn.Close(ctx)
				if err == nil {
					return nil
				}
			}
		}
		select {
		case <-b.proc.done:
			return errors.Newf("pgbouncer exited: %v", b.proc.err)
		case <-ctx.Done():
			return errors.Wrapf(ctx.Err(), "last attempt: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// isOurs reports, as an error, when what answers on b.port is not this
// PgBouncer.
func (b *PgBouncer) isOurs(ctx context.Context) error {
	cc, err := pgx.ParseConfig(b.URL("pgbouncer", "postgres"))
	if err != nil {
		return errors.WithStack(err)
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // all the admin console speaks
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cc)
	if err != nil {
		return errors.WithStack(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	rows, err := conn.Query(cctx, "SHOW CONFIG")
	if err != nil {
		return errors.WithStack(err)
	}
	pidfile := ""
	for rows.Next() {
		v, err := rows.Values()
		if err != nil {
			rows.Close()
			return errors.WithStack(err)
		}
		if len(v) >= 2 && fmt.Sprint(v[0]) == "pidfile" {
			pidfile = fmt.Sprint(v[1])
		}
	}
	if err := rows.Err(); err != nil {
		return errors.WithStack(err)
	}
	if pidfile != b.pidfile() {
		return errors.Newf("port %d is answered by another PgBouncer (pid file %q)", b.port, pidfile)
	}
	return nil
}

// Port returns the port PgBouncer listens on (127.0.0.1).
func (b *PgBouncer) Port() int { return b.port }

// URL returns the URL of database as user through the pooler.
func (b *PgBouncer) URL(database, user string) string {
	u := url.URL{Scheme: "postgres", User: url.User(user), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)),
		Path: "/" + database, RawQuery: "sslmode=disable"}
	return u.String()
}

// Stop stops PgBouncer (SIGTERM, its immediate shutdown, then SIGKILL after 10 s)
// and removes its directory.
func (b *PgBouncer) Stop() error {
	b.stop()
	return errors.Wrapf(os.RemoveAll(b.dir), "pgcluster: remove %s", b.dir)
}

func (b *PgBouncer) stop() {
	p := b.proc
	if p == nil {
		return
	}
	b.proc = nil
	defer func() { _ = p.log.Close() }()
	// SIGINT is PgBouncer's "safe shutdown" (waits for clients to
	// finish); SIGTERM its immediate one.
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(10 * time.Second):
	}
	_ = signalGroup(p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}
