package console

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/telemetry"
	"github.com/annals-dev/annals/scheduler"
)

//go:embed queries.sql
var queriesSQL string

// Principal is who makes a request, as an Authorizer (or the token login)
// establishes it.
type Principal struct {
	// Name identifies the person or system; it is what the audit log
	// records as the actor. Required for writes.
	Name string
	// Operator reports whether the principal may change things (retry,
	// skip and purge dead letters, set checkpoints, pause and resume cron
	// tasks). Reading needs no principal.
	Operator bool
}

// Authorizer decides who makes a request. It returns ok false when the
// request carries no acceptable credentials; the console then treats it as
// anonymous (it may read, never write). A service that mounts the console
// behind its own login supplies one.
type Authorizer func(r *http.Request) (p Principal, ok bool)

// Config configures a Console. A nil *Config means defaults.
type Config struct {
	// Schema is the PostgreSQL schema holding the annals tables. Defaults
	// to "annals".
	Schema string
	// ReadOnly shows everything and changes nothing: every write is
	// refused (403) and no action form is shown. Defaults to false.
	ReadOnly bool
	// AuthToken, when set, lets an operator sign in with it (the login form
	// sets a session cookie) or send it as "Authorization: Bearer TOKEN";
	// either way the principal is an operator. A bearer request's principal
	// is named by its X-Annals-Actor header, "token" without one (the
	// audit log's actor). Defaults to "" (no token login).
	AuthToken string
	// Authorizer, when set, is asked first for every request. Defaults to
	// nil. With neither AuthToken nor Authorizer the console cannot write.
	Authorizer Authorizer
	// SessionKey is the key that signs the console's cookies: the session
	// of a token login and the CSRF tokens of its forms. Replicas of the
	// console behind one load balancer need the same key, or a login or a
	// form one of them made is refused by another; with a key that
	// outlives the process, a restart does not sign everyone out. It must
	// be at least MinSessionKey (32) random bytes, kept secret like a
	// password (New refuses a shorter one, and keeps no copy of it in the
	// Config). Defaults to 32 random bytes of this process. It is not
	// derived from AuthToken: the login page gives any visitor a CSRF
	// cookie and its token, from which a key derived from the token would
	// let them test guesses of the token offline. Changing AuthToken signs
	// everyone out whatever the key (a session is signed with the token
	// too).
	SessionKey []byte
	// BasePath is the path the console is mounted at, e.g. "/annals" when a
	// service routes "/annals/" to http.StripPrefix("/annals", console).
	// Links and forms are made under it. It is path segments of letters,
	// digits, "-", ".", "_" and "~" (CheckBasePath); New refuses anything
	// else. Defaults to "": the prefix a router such as http.StripPrefix
	// took off each request's path (r.RequestURI against r.URL), the root
	// when there is none. Set it when that is not the path the browser sees
	// (a proxy in front strips a prefix of its own).
	BasePath string
	// StaleAfter is the heartbeat age past which a runner instance is
	// stale. Defaults to 30s (three heartbeats of the runner).
	StaleAfter time.Duration
	// FollowInterval is how often a live follow (server-sent events) looks
	// for new events. Defaults to 500ms.
	FollowInterval time.Duration
	// Metrics, when set, serves /metrics. Defaults to nil: the console
	// serves /metrics from a Metrics of its own reading the database
	// (NewMetrics with the same pool and schema).
	Metrics *Metrics
	// Logger receives request errors. Defaults to warnings and errors on
	// slog.Default() (information and debug records dropped).
	Logger *slog.Logger
	// Now is the clock for session expiry. Defaults to time.Now.
	Now func() time.Time
}

// Console is the operator console, an http.Handler. Create it with New.
type Console struct {
	*reader
	cfg        Config
	dlq        *deadletter.Store
	cps        *checkpoint.Store
	sched      *scheduler.Scheduler
	secret     []byte
	mux        *http.ServeMux
	metrics    *Metrics
	tpl        *templates
	canOpMu    sync.Mutex
	canOp      *bool
	canOpCheck time.Time
}

// New returns the console on pool. It does not touch the database.
func New(pool *pgxpool.Pool, cfg *Config) (*Console, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	var err error
	if c.Schema, err = schemaname.Resolve(c.Schema); err != nil {
		return nil, err
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = 30 * time.Second
	}
	if c.FollowInterval <= 0 {
		c.FollowInterval = 500 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = telemetry.DefaultLogger()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.BasePath = strings.TrimSuffix(c.BasePath, "/")
	if err := CheckBasePath(c.BasePath); err != nil {
		return nil, errors.Wrap(err, "console: BasePath")
	}
	rd, err := newReader(pool, c.Schema, c.StaleAfter)
	if err != nil {
		return nil, err
	}
	dlq, err := deadletter.New(pool, &deadletter.Config{Schema: c.Schema})
	if err != nil {
		return nil, err
	}
	cps, err := checkpoint.New(c.Schema)
	if err != nil {
		return nil, err
	}
	store, err := eventstore.New(pool, &eventstore.Config{Schema: c.Schema})
	if err != nil {
		return nil, err
	}
	sched, err := scheduler.New(store, nil)
	if err != nil {
		return nil, err
	}
	tpl, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	secret, err := sessionKey(c.SessionKey)
	if err != nil {
		return nil, err
	}
	c.SessionKey = nil // one copy, in secret
	con := &Console{reader: rd, cfg: c, dlq: dlq, cps: cps, sched: sched, tpl: tpl, metrics: c.Metrics, secret: secret}
	if con.metrics == nil {
		if con.metrics, err = NewMetrics(pool, &MetricsConfig{Schema: c.Schema, StaleAfter: c.StaleAfter}); err != nil {
			return nil, err
		}
	}
	con.routes()
	return con, nil
}

// MinSessionKey is the shortest Config.SessionKey New accepts, in bytes.
const MinSessionKey = 32

// sessionKey returns the key that signs the console's cookies: a copy of
// key, else random bytes. It is never derived from the AuthToken: the
// login page hands any visitor a CSRF cookie and its token, which would
// let them test guesses of the AuthToken offline. The error never holds
// the key.
func sessionKey(key []byte) ([]byte, error) {
	switch {
	case len(key) > 0 && len(key) < MinSessionKey:
		return nil, errors.Newf("console: SessionKey is %d bytes; it must be at least %d (random bytes, the same for every replica)", len(key), MinSessionKey)
	case len(key) > 0:
		return bytes.Clone(key), nil
	}
	b := make([]byte, MinSessionKey)
	if _, err := rand.Read(b); err != nil {
		return nil, errors.Wrap(err, "console: random session key")
	}
	return b, nil
}

// CheckBasePath reports whether p may be a Config.BasePath: "" (the root),
// or one or more path segments, each a "/" and then letters, digits, "-",
// ".", "_" or "~" (the characters a URL never escapes), none "." or "..",
// and no trailing "/" (New trims one). Anything else would have to be
// escaped in every link the console makes, and a service (or annals ui)
// routing it with http.ServeMux would read "{x}" as a wildcard and a space
// as the end of a method.
func CheckBasePath(p string) error {
	if p == "" {
		return nil
	}
	bad := func(why string) error {
		return errors.Newf("%q: %s; want a path such as /annals or /ops/annals: segments of letters, digits, '-', '.', '_' and '~'", p, why)
	}
	if p[0] != '/' {
		return bad("it must start with /")
	}
	for _, seg := range strings.Split(p[1:], "/") {
		switch seg {
		case "":
			return bad("an empty segment (// or a trailing /)")
		case ".", "..":
			return bad("a segment . or ..")
		}
		for _, r := range seg {
			if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("-._~", r)) {
				return bad(fmt.Sprintf("the character %q", r))
			}
		}
	}
	return nil
}

// base is the path the console is served under for r: Config.BasePath, or,
// without one, the prefix a router took off the path before passing r on
// (http.StripPrefix does: r.RequestURI keeps the path the client asked
// for), so that a console mounted with http.StripPrefix("/ops", con) and no
// BasePath still links, redirects and sets its cookies under /ops. A prefix
// that CheckBasePath refuses is not used: "" then, as without a prefix.
func (c *Console) base(r *http.Request) string {
	if c.cfg.BasePath != "" {
		return c.cfg.BasePath
	}
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil {
		return ""
	}
	prefix, ok := strings.CutSuffix(u.EscapedPath(), r.URL.EscapedPath())
	if !ok || CheckBasePath(prefix) != nil {
		return ""
	}
	return prefix
}

// ServeHTTP serves the console.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; form-action 'self'")
	// Every value the console passes on to PostgreSQL is text, which holds
	// neither NUL nor bytes that are not UTF-8: such input is refused here,
	// rather than failing in the database as an internal error.
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "The request's query or form cannot be read: "+err.Error())
		return
	}
	if bad := notText(r.URL.Path, r.Form); bad != "" {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("%s is not text (a NUL byte, or bytes that are not UTF-8): nothing was read or changed.", bad))
		return
	}
	c.mux.ServeHTTP(w, r)
}

// notText names the first of path and the form's values that PostgreSQL
// would refuse as text, or returns "".
func notText(path string, form url.Values) string {
	bad := func(s string) bool { return !utf8.ValidString(s) || strings.ContainsRune(s, 0) }
	if bad(path) {
		return "The path"
	}
	for k, vs := range form {
		if bad(k) {
			return "A parameter's name"
		}
		for _, v := range vs {
			if bad(v) {
				return fmt.Sprintf("The value of %q", k)
			}
		}
	}
	return ""
}

func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", c.page(c.overview))
	m.HandleFunc("GET /streams", c.page(c.streams))
	m.HandleFunc("GET /streams/{id...}", c.page(c.stream))
	m.HandleFunc("GET /events", c.page(c.log))
	m.HandleFunc("GET /events/follow", c.follow)
	m.HandleFunc("GET /events/{pos}", c.page(c.event))
	m.HandleFunc("GET /events/{pos}/data", c.eventRaw(false))
	m.HandleFunc("GET /events/{pos}/metadata", c.eventRaw(true))
	m.HandleFunc("GET /subscribers/{name}", c.page(c.subscriber))
	m.HandleFunc("GET /dead-letters", c.page(c.deadLetters))
	m.HandleFunc("GET /dead-letters/{id}", c.page(c.deadLetter))
	m.HandleFunc("GET /scheduler", c.page(c.scheduler))
	m.HandleFunc("GET /instances", c.page(c.instances))
	m.HandleFunc("GET /audit", c.page(c.audit))
	m.HandleFunc("GET /login", c.page(c.loginForm))
	m.HandleFunc("POST /login", c.login)
	m.HandleFunc("POST /logout", c.write("", c.logout))
	m.HandleFunc("POST /dead-letters/retry", c.write("dlq.retry", c.dlqRetry))
	m.HandleFunc("POST /dead-letters/skip", c.write("dlq.skip", c.dlqSkip))
	m.HandleFunc("POST /dead-letters/retry-all", c.write("dlq.retry_all", c.dlqRetryAll))
	m.HandleFunc("POST /dead-letters/purge", c.write("dlq.purge", c.dlqPurge))
	m.HandleFunc("POST /subscribers/{name}/checkpoint", c.write("checkpoint.set", c.checkpointSet))
	m.HandleFunc("POST /scheduler/tasks/{name}/pause", c.write("cron.pause", c.taskPause))
	m.HandleFunc("POST /scheduler/tasks/{name}/resume", c.write("cron.resume", c.taskResume))
	m.Handle("GET /static/", http.StripPrefix("/static/", staticHandler()))
	m.Handle("GET /metrics", c.metrics)
	m.Handle("GET /healthz", Liveness())
	m.Handle("GET /readyz", Readiness(c.pool, &HealthConfig{Schema: c.cfg.Schema}))
	c.mux = m
}

// canOperate reports whether the database role may do the console's writes,
// asked at most every 30 seconds.
func (c *Console) canOperate(ctx context.Context) bool {
	c.canOpMu.Lock()
	defer c.canOpMu.Unlock()
	if c.canOp != nil && c.cfg.Now().Sub(c.canOpCheck) < 30*time.Second {
		return *c.canOp
	}
	var ok bool
	if err := c.pool.QueryRow(ctx, c.q["CanOperate"], c.cfg.Schema).Scan(&ok); err != nil {
		c.cfg.Logger.Warn("console: check the database role's privileges", telemetry.Err(err))
		return false
	}
	c.canOp, c.canOpCheck = &ok, c.cfg.Now()
	return ok
}
