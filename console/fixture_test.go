package console_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/console"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/scheduler"
)

func TestMain(m *testing.M) { annalstest.Main(m) }

const token = "test-token-0123456789abcdef"

// mailer is an observer that fails on payment.declined while failing is
// set (and records what it handled).
type mailer struct {
	failing atomic.Bool
	handled atomic.Int64
}

func (m *mailer) Name() string { return "mailer" }

func (m *mailer) Handle(_ context.Context, e eventstore.Event) error {
	if e.Type == "payment.declined" && m.failing.Load() {
		return fmt.Errorf("smtp: 550 mailbox unavailable for %s", e.StreamID)
	}
	m.handled.Add(1)
	return nil
}

// fixture is a database with real data: events in several streams, a
// running runner whose observer dead-lettered one event, a cron task and a
// timer, and a console served by httptest.
type fixture struct {
	db      *annalstest.DB
	store   *eventstore.Store
	mailer  *mailer
	runner  *projection.Runner
	stop    context.CancelFunc
	stopped chan struct{}
	dlID    int64
	con     *console.Console
	srv     *httptest.Server
	metrics *console.Metrics
}

type fixtureOpts struct {
	readOnly bool
	pool     func(db *annalstest.DB) *pgxpool.Pool // the console's pool; default the owner's
}

func setup(t *testing.T, o *fixtureOpts) *fixture {
	t.Helper()
	if o == nil {
		o = &fixtureOpts{}
	}
	ctx := t.Context()
	f := &fixture{db: annalstest.NewDB(t, nil), mailer: &mailer{}}
	f.mailer.failing.Store(true)
	var err error
	f.metrics, err = console.NewMetrics(f.db.Pool, &console.MetricsConfig{Schema: f.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if f.store, err = eventstore.New(f.db.Pool, &eventstore.Config{Schema: f.db.Schema, MeterProvider: f.metrics.MeterProvider()}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		stream := fmt.Sprintf("order-%d", i)
		evs := []eventstore.EventData{
			{Type: "order.placed", Data: map[string]any{"order": stream, "total": 10 * i, "lines": []string{"book", "pen"}}, Metadata: eventstore.Metadata{Extra: map[string]any{"user": "alice"}}},
			{Type: "order.shipped", Data: map[string]any{"order": stream, "carrier": "dhl"}},
		}
		if i == 3 {
			evs = append(evs, eventstore.EventData{Type: "payment.declined", Data: map[string]any{"order": stream, "reason": "card expired"}})
		}
		if _, err := f.store.Append(ctx, stream, eventstore.NoStream, evs...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.store.Append(ctx, "customer-7", eventstore.NoStream, eventstore.EventData{Type: "customer.registered", Data: map[string]string{"name": "Ada"}}); err != nil {
		t.Fatal(err)
	}
	f.runner, err = projection.NewRunner(f.db.Pool, &projection.Config{Schema: f.db.Schema, PollInterval: 50 * time.Millisecond,
		HeartbeatInterval: time.Second, MeterProvider: f.metrics.MeterProvider(), HandlerSpans: true,
		Retry: &projection.RetryPolicy{MaxRetries: 1, InitialDelay: 10 * time.Millisecond, Jitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.runner.Register(f.mailer, nil); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	f.stop, f.stopped = stop, make(chan struct{})
	go func() {
		defer close(f.stopped)
		if err := f.runner.Run(rctx); err != nil {
			t.Errorf("runner: %v", err)
		}
	}()
	t.Cleanup(f.stopRunner)
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		err := f.db.Pool.QueryRow(ctx, `SELECT id FROM annals.dead_letters WHERE subscriber_id = 'mailer'`).Scan(&f.dlID)
		return err == nil
	})
	// The observer checkpoints past the dead letter once it has handled the
	// rest; its checkpoint is written a moment after the handling (an
	// observer commits in batches): wait for it, so that tests comparing
	// the database before and after see no move of its own.
	annalstest.WaitFor(t, 20*time.Second, func() bool { return f.mailer.handled.Load() == 11 })
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		var caughtUp bool
		err := f.db.Pool.QueryRow(ctx, `SELECT c.position >= (SELECT max(global_sequence) FROM annals.events)
			FROM annals.checkpoints c WHERE c.subscriber_id = 'mailer'`).Scan(&caughtUp)
		return err == nil && caughtUp
	})

	sched, err := scheduler.New(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sched.AddTask(ctx, scheduler.Task{Name: "nightly-report", Spec: "30 2 * * *", TimeZone: "Europe/Berlin", StreamID: "reports"}); err != nil {
		t.Fatal(err)
	}
	if _, err := sched.Schedule(ctx, nil, time.Now().Add(time.Hour), "order-1",
		eventstore.EventData{Type: "order.payment_deadline", Data: map[string]int{"order": 1}}); err != nil {
		t.Fatal(err)
	}

	pool := f.db.Pool
	if o.pool != nil {
		pool = o.pool(f.db)
	}
	f.con, err = console.New(pool, &console.Config{Schema: f.db.Schema, AuthToken: token, ReadOnly: o.readOnly,
		Metrics: f.metrics, FollowInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(f.con)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) stopRunner() {
	f.stop()
	<-f.stopped
}

// client is a browser-like HTTP client: a cookie jar, no redirects followed
// unless asked.
type client struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func (f *fixture) client(t *testing.T) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, base: f.srv.URL, hc: &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (c *client) do(req *http.Request) (int, string, http.Header) {
	c.t.Helper()
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

func (c *client) get(path string) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.base+path, nil)
	code, body, _ := c.do(req)
	return code, body
}

func (c *client) post(path string, form url.Values, hdr ...string) (int, string, http.Header) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return c.do(req)
}

// act posts form (with the CSRF token tok) to the action at path, fails the
// test unless the action redirected (it succeeded), and returns the
// message it redirected with.
func (c *client) act(tok, path string, form url.Values) string {
	c.t.Helper()
	form.Set("csrf", tok)
	code, body, hdr := c.post(path, form)
	if code != http.StatusSeeOther {
		c.t.Fatalf("POST %s: %d %s", path, code, line(body, `id="error"`))
	}
	u, _ := url.Parse(hdr.Get("Location"))
	return u.Query().Get("done")
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// csrf loads a page and returns the CSRF token of its forms.
func (c *client) csrf() string {
	c.t.Helper()
	code, body := c.get("/login")
	m := csrfRe.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		c.t.Fatalf("GET /login: %d, no CSRF token in %q", code, body)
	}
	return m[1]
}

// login signs in with the token as name.
func (c *client) login(name string) string {
	c.t.Helper()
	tok := c.csrf()
	code, body, _ := c.post("/login", url.Values{"csrf": {tok}, "name": {name}, "token": {token}})
	if code != http.StatusSeeOther {
		c.t.Fatalf("login: %d %s", code, body)
	}
	return tok
}

// state is every dead letter's status, every checkpoint and every cron
// task's pause flag, and the audit log's size: what an action may change.
func state(t *testing.T, db *annalstest.DB) string {
	t.Helper()
	var s string
	err := db.Pool.QueryRow(t.Context(), `
		SELECT coalesce((SELECT string_agg(id || ' ' || status || ' ' || updated_at, ', ' ORDER BY id) FROM annals.dead_letters), '') || ' | ' ||
		       coalesce((SELECT string_agg(subscriber_id || '/' || partition || ' ' || position || ' ' || epoch, ', ' ORDER BY 1) FROM annals.checkpoints), '') || ' | ' ||
		       coalesce((SELECT string_agg(name || ' ' || paused, ', ' ORDER BY name) FROM annals.cron_tasks), '') || ' | ' ||
		       (SELECT count(*) FROM annals.audit_log)`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func dlStatus(t *testing.T, db *annalstest.DB, id int64) string {
	t.Helper()
	var s string
	if err := db.Pool.QueryRow(t.Context(), "SELECT status FROM annals.dead_letters WHERE id = $1", id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

type auditRow struct {
	Actor, DBRole, Action, Target, Detail string
}

func auditLog(t *testing.T, db *annalstest.DB) []auditRow {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), "SELECT actor, db_role, action, target, detail::text FROM annals.audit_log ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (auditRow, error) {
		var a auditRow
		return a, r.Scan(&a.Actor, &a.DBRole, &a.Action, &a.Target, &a.Detail)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// rolePool creates a login role granted kind (none when kind is "") and
// returns a pool connected as it.
func rolePool(t *testing.T, db *annalstest.DB, kind migrations.RoleKind) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "console_" + string(kind) + "_" + hex.EncodeToString(b[:])
	pw := hex.EncodeToString(b[:]) + "pw"
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := db.Pool.Exec(ctx, "CREATE ROLE "+ident+" LOGIN PASSWORD "+schemaname.Literal(pw)); err != nil {
		t.Fatal(err)
	}
	if kind != "" {
		if err := migrations.Grant(ctx, db.Pool, name, kind, &migrations.Config{Schema: db.Schema}); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = name, pw
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		_, _ = db.Pool.Exec(ctx, "DROP OWNED BY "+ident)
		_, _ = db.Pool.Exec(ctx, "DROP ROLE "+ident)
	})
	return pool, name
}

var (
	htmlTags   = regexp.MustCompile(`<[^>]*>`)
	htmlSpaces = regexp.MustCompile(`\s+`)
)

// row returns the text of the table row of page whose first cells are
// cells, tags dropped, entities unescaped and spaces collapsed; the test
// fails when page does not answer 200 or has no such row.
// consoleOn serves a console (read-only, no runner) of db for the test and
// returns a client of it.
func consoleOn(t *testing.T, db *annalstest.DB) *client {
	t.Helper()
	con, err := console.New(db.Pool, &console.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	return &client{t: t, base: srv.URL, hc: srv.Client()}
}

func (c *client) row(page string, cells ...string) string {
	c.t.Helper()
	code, body := c.get(page)
	if code != 200 {
		c.t.Fatalf("GET %s: %d", page, code)
	}
	for _, tr := range strings.Split(body, "<tr") {
		text := strings.TrimSpace(htmlSpaces.ReplaceAllString(html.UnescapeString(htmlTags.ReplaceAllString("<tr"+tr, " ")), " "))
		if strings.HasPrefix(text, strings.Join(cells, " ")+" ") {
			return text
		}
	}
	c.t.Fatalf("GET %s: no row %q in\n%s", page, cells, body)
	return ""
}
