package advisorylock

import (
	"github.com/annals-dev/annals/internal/telemetry"

	"context"
	"log/slog"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// Defaults of Config.
const (
	// DefaultCheckInterval is the default Config.CheckInterval.
	DefaultCheckInterval = time.Second
	// DefaultKeepAliveIdle is the default Config.KeepAliveIdle.
	DefaultKeepAliveIdle = 5 * time.Second
	// DefaultKeepAliveInterval is the default Config.KeepAliveInterval.
	DefaultKeepAliveInterval = 2 * time.Second
	// DefaultKeepAliveCount is the default Config.KeepAliveCount.
	DefaultKeepAliveCount = 3
	// DefaultUserTimeout is the default Config.UserTimeout.
	DefaultUserTimeout = 10 * time.Second
	// DefaultFreezeTimeout is the default Config.FreezeTimeout: the same as
	// annals status's default --stale-after and the projection runner's
	// warning of a lock no live instance holds (three heartbeats of 10 s).
	DefaultFreezeTimeout = 30 * time.Second
	// MinFreezeTimeout is the shortest Config.FreezeTimeout: the lock pings
	// every third of it, and a holder must not lose its lock to a garbage
	// collection pause, a slow round trip or a loaded machine's scheduling
	// (at 100 ms, a ping every 33 ms, a test lost its lock under load on 2
	// cores).
	MinFreezeTimeout = time.Second
)

// Config configures TryAcquire. A nil *Config means defaults.
//
// The durations bound how long a dead peer keeps the lock: the server frees
// it when it notices the client is gone, and the client marks it lost when it
// notices the server is gone. Each setting is applied on both sides of the
// lock's connection where the platform allows (server: run-time parameters of
// the session; client: socket options, TCP_USER_TIMEOUT on Linux only). A
// negative value leaves a setting alone: the server's configuration, or a
// value in the connConfig's RuntimeParams, and the operating system's default.
type Config struct {
	// CheckInterval sets client_connection_check_interval for the session:
	// how often the server checks, while running a query, that the client is
	// still connected. Without it a holder killed in the middle of a query
	// keeps the lock until the query ends. It needs PostgreSQL 14 or later
	// on a platform with POLLRDHUP (Linux); set it to -1 for older servers.
	// Defaults to 1s.
	CheckInterval time.Duration
	// KeepAliveIdle is the idle time before the first TCP keepalive probe
	// (tcp_keepalives_idle on the server). Whole seconds; at least 1s.
	// Defaults to 5s.
	KeepAliveIdle time.Duration
	// KeepAliveInterval is the time between unanswered keepalive probes
	// (tcp_keepalives_interval on the server). Whole seconds; at least 1s.
	// Defaults to 2s.
	KeepAliveInterval time.Duration
	// KeepAliveCount is the number of unanswered probes after which the
	// connection is considered dead (tcp_keepalives_count on the server).
	// Defaults to 3.
	KeepAliveCount int
	// UserTimeout is how long sent data may remain unacknowledged before the
	// connection is dropped (tcp_user_timeout on the server, TCP_USER_TIMEOUT
	// on the client on Linux). It covers what keepalives do not: a peer that
	// vanishes while data is in flight. Defaults to 10s.
	UserTimeout time.Duration
	// FreezeTimeout bounds how long a holder that stops running while its
	// connections stay up (SIGSTOP, a paused container or VM, a debugger)
	// keeps its locks: it sets idle_session_timeout for the session, and
	// the holder pings it (an empty statement) every third of it while it
	// has nothing else to send, so a live holder keeps its locks however
	// long it idles, and a frozen one, which the kernel still answers TCP
	// keepalives for, has its session ended by the server after it: the
	// locks are freed, and once resumed it finds them lost. It covers an
	// idle session only, not one frozen in the middle of a transaction
	// (see "A frozen holder" in the package documentation). PostgreSQL 14
	// or later. Whole milliseconds; at least MinFreezeTimeout; -1 sets
	// nothing and pings nothing. Defaults to 30s.
	FreezeTimeout time.Duration
	// Logger receives a warning when a lock is lost, and debug lines when a
	// lock is acquired or released. Defaults to warnings and errors on
	// slog.Default() (information and debug records dropped).
	Logger *slog.Logger
	// ReleaseChannel, if set, is a notification channel (at most 63 bytes)
	// that connects leaders with standbys: Lock.Release announces the
	// released key on it (pg_notify, in the unlock's round trip), and a
	// Standby LISTENs on it, so that a graceful handover takes effect at once
	// instead of at the standby's next poll. A lock whose holder dies
	// announces nothing; the standbys' polls find it free. Defaults to none.
	ReleaseChannel string
	// Connect, if set, opens each of the lock's connections (and a
	// Standby's) in place of pgx.ConnectConfig. It is given the settings
	// to connect with (a copy of the connConfig, set up for the lock as
	// above) and may change them before it connects: the place to supply a
	// password that rotates (an IAM token) at every connection, or to run
	// a pool's BeforeConnect and AfterConnect hooks, so that the lock's
	// sessions log in as the pool's do. It must keep the settings'
	// DialFunc and BuildContextWatcherHandler, which the lock relies on.
	// Defaults to pgx.ConnectConfig.
	Connect func(ctx context.Context, connConfig *pgx.ConnConfig) (*pgx.Conn, error)
}

// maxFreezeTimeout is the longest idle_session_timeout PostgreSQL takes
// (INT_MAX milliseconds, about 24.8 days).
const maxFreezeTimeout = math.MaxInt32 * time.Millisecond

// maxChannelLen is the longest notification channel name PostgreSQL takes
// (NAMEDATALEN - 1).
const maxChannelLen = 63

func (c *Config) withDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	if out.CheckInterval == 0 {
		out.CheckInterval = DefaultCheckInterval
	}
	if out.KeepAliveIdle == 0 {
		out.KeepAliveIdle = DefaultKeepAliveIdle
	}
	if out.KeepAliveInterval == 0 {
		out.KeepAliveInterval = DefaultKeepAliveInterval
	}
	if out.KeepAliveCount == 0 {
		out.KeepAliveCount = DefaultKeepAliveCount
	}
	if out.UserTimeout == 0 {
		out.UserTimeout = DefaultUserTimeout
	}
	if out.FreezeTimeout == 0 {
		out.FreezeTimeout = DefaultFreezeTimeout
	}
	if out.Connect == nil {
		out.Connect = pgx.ConnectConfig
	}
	if out.Logger == nil {
		out.Logger = telemetry.DefaultLogger()
	}
	switch {
	case out.CheckInterval > 0 && out.CheckInterval < time.Millisecond:
		return out, errors.Newf("advisorylock: CheckInterval %s is below the server's resolution of 1ms", out.CheckInterval)
	case out.UserTimeout > 0 && out.UserTimeout < time.Millisecond:
		return out, errors.Newf("advisorylock: UserTimeout %s is below the resolution of 1ms", out.UserTimeout)
	case out.FreezeTimeout > 0 && out.FreezeTimeout < MinFreezeTimeout:
		return out, errors.Newf("advisorylock: FreezeTimeout %s is below the minimum of %s (or -1 for none)", out.FreezeTimeout, MinFreezeTimeout)
	case out.FreezeTimeout > 0 && out.FreezeTimeout%time.Millisecond != 0:
		return out, errors.Newf("advisorylock: FreezeTimeout %s is not a whole number of milliseconds", out.FreezeTimeout)
	case out.FreezeTimeout > maxFreezeTimeout:
		return out, errors.Newf("advisorylock: FreezeTimeout %s is above the server's maximum of %s", out.FreezeTimeout, maxFreezeTimeout)
	case out.KeepAliveIdle > 0 && out.KeepAliveIdle%time.Second != 0:
		return out, errors.Newf("advisorylock: KeepAliveIdle %s is not a whole number of seconds", out.KeepAliveIdle)
	case out.KeepAliveInterval > 0 && out.KeepAliveInterval%time.Second != 0:
		return out, errors.Newf("advisorylock: KeepAliveInterval %s is not a whole number of seconds", out.KeepAliveInterval)
	case len(out.ReleaseChannel) > maxChannelLen:
		return out, errors.Newf("advisorylock: ReleaseChannel %q is longer than %d bytes", out.ReleaseChannel, maxChannelLen)
	}
	return out, nil
}

// FreezeTimeoutOf returns the FreezeTimeout of a lock opened with cfg: its
// FreezeTimeout, DefaultFreezeTimeout when cfg is nil or leaves it 0, and 0
// when it is -1 (none). A holder that limits how long its own
// transactions on other connections may idle (a projection's batches)
// bounds them with it.
func FreezeTimeoutOf(cfg *Config) time.Duration {
	switch {
	case cfg == nil || cfg.FreezeTimeout == 0:
		return DefaultFreezeTimeout
	case cfg.FreezeTimeout < 0:
		return 0
	}
	return cfg.FreezeTimeout
}

// freezeSetting is the session's idle_session_timeout as MarkSession sets
// it: nil (none) unless FreezeTimeout is set.
func (c *Config) freezeSetting() any {
	if c.FreezeTimeout <= 0 {
		return nil
	}
	return strconv.FormatInt(c.FreezeTimeout.Milliseconds(), 10) + "ms"
}

// pingEvery is how often an idle lock session is pinged: a third of
// FreezeTimeout, so that a ping that comes a little late, or a round trip
// that is slow, still lands well within it. 0: never.
func (c *Config) pingEvery() time.Duration {
	if c.FreezeTimeout <= 0 {
		return 0
	}
	return c.FreezeTimeout / 3
}

// pingTimeout bounds a ping's round trip: a server that does not answer
// an empty statement within FreezeTimeout (at least closeTimeout) is taken
// to be gone, and the connection is closed, which frees its locks.
func (c *Config) pingTimeout() time.Duration { return max(c.FreezeTimeout, closeTimeout) }

// ping sends the server an empty statement (a comment: parsed, nothing
// planned or run), which ends the session's idle time, within timeout. It
// uses a context of its own, not the watcher's or a Wait's: a ping that is
// cut in the middle closes the connection, so nothing interrupts it.
func ping(conn *pgx.Conn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return conn.PgConn().Ping(ctx)
}

// connConfig returns a copy of base set up for a lock connection: the
// session parameters, the socket options, and the context handler that lets
// the watcher stop waiting without harm. handler returns the context handler
// of a connection made with it.
func (c *Config) connConfig(base *pgx.ConnConfig) (cc *pgx.ConnConfig, handler func(*pgconn.PgConn) *ctxHandler) {
	cc = base.Copy()
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	setMillis := func(name string, d time.Duration) {
		if d > 0 {
			cc.RuntimeParams[name] = strconv.FormatInt(d.Milliseconds(), 10) + "ms"
		}
	}
	setMillis("client_connection_check_interval", c.CheckInterval)
	setMillis("tcp_keepalives_idle", c.KeepAliveIdle)
	setMillis("tcp_keepalives_interval", c.KeepAliveInterval)
	if c.KeepAliveCount > 0 {
		cc.RuntimeParams["tcp_keepalives_count"] = strconv.Itoa(c.KeepAliveCount)
	}
	setMillis("tcp_user_timeout", c.UserTimeout)

	dial := cc.DialFunc
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if tcp, ok := conn.(*net.TCPConn); ok {
			if err := c.setSocketOptions(tcp); err != nil {
				return nil, errors.CombineErrors(errors.Wrap(err, "advisorylock: set socket options"), conn.Close())
			}
		}
		return conn, nil
	}

	// Fallback hosts may build handlers for connections that are then
	// discarded, hence the map.
	var mu sync.Mutex
	handlers := map[*pgconn.PgConn]*ctxHandler{}
	build := cc.BuildContextWatcherHandler
	cc.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		h := &ctxHandler{conn: pc.Conn(), inner: build(pc)}
		mu.Lock()
		defer mu.Unlock()
		handlers[pc] = h
		return h
	}
	return cc, func(pc *pgconn.PgConn) *ctxHandler {
		mu.Lock()
		defer mu.Unlock()
		return handlers[pc]
	}
}

// setSocketOptions applies the client side of the keepalive and user timeout
// settings to a freshly dialled connection.
func (c *Config) setSocketOptions(conn *net.TCPConn) error {
	if c.KeepAliveIdle > 0 || c.KeepAliveInterval > 0 || c.KeepAliveCount > 0 {
		ka := net.KeepAliveConfig{Enable: true, Idle: -1, Interval: -1, Count: -1}
		if c.KeepAliveIdle > 0 {
			ka.Idle = c.KeepAliveIdle
		}
		if c.KeepAliveInterval > 0 {
			ka.Interval = c.KeepAliveInterval
		}
		if c.KeepAliveCount > 0 {
			ka.Count = c.KeepAliveCount
		}
		if err := conn.SetKeepAliveConfig(ka); err != nil {
			return errors.Wrap(err, "TCP keepalive")
		}
	}
	if c.UserTimeout > 0 {
		return setUserTimeout(conn, c.UserTimeout)
	}
	return nil
}

// watchKey marks the watcher's context (see ctxHandler).
type watchKey struct{}

// ctxHandler is the context handler of a lock connection. When the watcher's
// context is cancelled it sets an immediate deadline on the socket, which
// ends the watcher's read with a timeout that pgconn does not treat as fatal,
// so the connection stays usable. Every other context goes to the handler
// the connConfig asked for (pgx's default also sets a deadline, but a
// CancelRequestContextWatcherHandler would send the server a cancel request
// for an idle session each time Do stops the watcher).
type ctxHandler struct {
	conn  net.Conn
	inner ctxwatch.Handler
	// byInner says whether the last HandleCancel went to inner. ctxwatch
	// calls HandleUnwatchAfterCancel only after HandleCancel has returned.
	byInner bool
	// watcherCancels counts the watcher's waits that were cut by a deadline
	// (for the tests: a stop that came before the wait began does not count).
	watcherCancels atomic.Int64
}

// HandleCancel implements ctxwatch.Handler.
func (h *ctxHandler) HandleCancel(ctx context.Context) {
	h.byInner = ctx.Value(watchKey{}) == nil
	if h.byInner {
		h.inner.HandleCancel(ctx)
		return
	}
	h.watcherCancels.Add(1)
	_ = h.conn.SetDeadline(time.Now()) // fails only on a closed socket, and then the read fails anyway
}

// HandleUnwatchAfterCancel implements ctxwatch.Handler.
func (h *ctxHandler) HandleUnwatchAfterCancel() {
	if h.byInner {
		h.inner.HandleUnwatchAfterCancel()
		return
	}
	_ = h.conn.SetDeadline(time.Time{}) // as above
}
