package console_test

import (
	"bytes"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/console"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/scheduler"
)

// replicas is a load balancer in front of consoles of one database: each
// request goes to the console the test last picked with to. Its client
// keeps one cookie jar, as a browser does.
type replicas struct {
	t   *testing.T
	db  *annalstest.DB
	cur atomic.Pointer[console.Console]
	c   *client
}

// newReplicas makes a database with the cron task "nightly-report" (what
// the writes pause) and a load balancer with no console behind it yet.
func newReplicas(t *testing.T) *replicas {
	t.Helper()
	rs := &replicas{t: t, db: annalstest.NewDB(t, nil)}
	store, err := eventstore.New(rs.db.Pool, &eventstore.Config{Schema: rs.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	sched, err := scheduler.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sched.AddTask(t.Context(), scheduler.Task{Name: "nightly-report", Spec: "30 2 * * *", StreamID: "reports"}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { rs.cur.Load().ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	rs.c = &client{t: t, base: srv.URL, hc: &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	return rs
}

// replica makes a console (a replica, or one restarted) with cfg.
func (rs *replicas) replica(cfg console.Config) *console.Console {
	rs.t.Helper()
	cfg.Schema = rs.db.Schema
	con, err := console.New(rs.db.Pool, &cfg)
	if err != nil {
		rs.t.Fatal(err)
	}
	return con
}

// to sends the next requests to con.
func (rs *replicas) to(con *console.Console) { rs.cur.Store(con) }

// pause posts the pause of the cron task with the CSRF token tok (and
// header hdr) and returns the status and the Location it redirected to.
func (rs *replicas) pause(tok string, hdr ...string) (int, string) {
	rs.t.Helper()
	code, _, h := rs.c.post("/scheduler/tasks/nightly-report/pause", url.Values{"csrf": {tok}}, hdr...)
	return code, h.Get("Location")
}

// TestTokenAloneSharesNoSessions: consoles given the same AuthToken and no
// SessionKey sign with keys of their own (random per process: a key
// derived from the token would let a visitor test guesses of the token
// offline, from the CSRF cookie and token the sign-in page gives anyone),
// so a form one made is refused by another. Given the same SessionKey too,
// a token login and a form one replica made are accepted by another and by
// a console restarted with that key; a console with another token refuses
// the session.
func TestTokenAloneSharesNoSessions(t *testing.T) {
	t.Parallel()
	rs := newReplicas(t)
	rs.to(rs.replica(console.Config{AuthToken: token}))
	tok := rs.c.login("ada")
	rs.to(rs.replica(console.Config{AuthToken: token}))
	if code, _ := rs.pause(tok); code != http.StatusForbidden {
		t.Fatalf("a form of another console of the same token and no key: %d, want 403", code)
	}

	key := bytes.Repeat([]byte("k"), 32)
	a := rs.replica(console.Config{AuthToken: token, SessionKey: key})
	b := rs.replica(console.Config{AuthToken: token, SessionKey: bytes.Clone(key)})
	rs.to(a)
	tok = rs.c.login("ada")
	rs.to(b)
	code, loc := rs.pause(tok)
	if code != http.StatusSeeOther {
		t.Fatalf("a write to replica b with a login and form of replica a: %d, want 303", code)
	}
	// The message the write redirects with is signed too: replica a shows
	// what b did.
	rs.to(a)
	if code, body := rs.c.get(strings.TrimPrefix(loc, rs.c.base)); code != 200 || !strings.Contains(body, "Task nightly-report: pause done.") {
		t.Errorf("replica a showing replica b's redirect %s: %d, no done message", loc, code)
	}
	rs.to(rs.replica(console.Config{AuthToken: token, SessionKey: bytes.Clone(key)}))
	if code, _ := rs.pause(tok); code != http.StatusSeeOther {
		t.Errorf("a write after a restart with the key: %d, want 303", code)
	}
	// Another token signs everyone out, whatever the key.
	rs.to(rs.replica(console.Config{AuthToken: token + "-other", SessionKey: bytes.Clone(key)}))
	if code, _ := rs.pause(rs.c.csrf()); code != http.StatusUnauthorized {
		t.Errorf("a session of another token: %d, want 401", code)
	}
	if log := auditLog(t, rs.db); len(log) != 2 || log[0].Actor != "ada" || log[1].Actor != "ada" {
		t.Errorf("audit %+v, want two pauses by ada", log)
	}
}

// TestSessionKeyShared: consoles embedded with an Authorizer and the same
// SessionKey accept each other's forms; one with another key, or with none
// (a random key of its own), refuses them.
func TestSessionKeyShared(t *testing.T) {
	t.Parallel()
	rs := newReplicas(t)
	key := bytes.Repeat([]byte("k"), 32)
	auth := func(r *http.Request) (console.Principal, bool) {
		if r.Header.Get("X-User") == "grace" {
			return console.Principal{Name: "grace", Operator: true}, true
		}
		return console.Principal{}, false
	}
	a := rs.replica(console.Config{Authorizer: auth, SessionKey: key})
	b := rs.replica(console.Config{Authorizer: auth, SessionKey: bytes.Clone(key)})
	rs.to(a)
	// No token login: the scheduler's forms, shown to an operator, carry
	// the CSRF token.
	req, _ := http.NewRequest(http.MethodGet, rs.c.base+"/scheduler", nil)
	req.Header.Set("X-User", "grace")
	_, body, _ := rs.c.do(req)
	m := csrfRe.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token on /scheduler")
	}
	tok := m[1]
	rs.to(b)
	if code, _ := rs.pause(tok, "X-User", "grace"); code != http.StatusSeeOther {
		t.Fatalf("a write to replica b with a form of replica a: %d, want 303", code)
	}
	for name, cfg := range map[string]console.Config{
		"OtherKey": {Authorizer: auth, SessionKey: bytes.Repeat([]byte("x"), 32)},
		"NoKey":    {Authorizer: auth},
	} {
		rs.to(rs.replica(cfg))
		if code, _ := rs.pause(tok, "X-User", "grace"); code != http.StatusForbidden {
			t.Errorf("%s: a form of replica a: %d, want 403", name, code)
		}
	}
	if log := auditLog(t, rs.db); len(log) != 1 || log[0].Actor != "grace" {
		t.Errorf("audit %+v, want one pause by grace", log)
	}
}

// TestSessionKeyTooShort: New refuses a SessionKey shorter than 32 bytes,
// without showing it.
func TestSessionKeyTooShort(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	key := []byte("short-session-key-0123456789")
	_, err := console.New(db.Pool, &console.Config{Schema: db.Schema, AuthToken: token, SessionKey: key})
	if err == nil || !strings.Contains(err.Error(), "at least 32") || strings.Contains(err.Error(), string(key)) {
		t.Fatalf("New with a %d-byte SessionKey: %v", len(key), err)
	}
}
