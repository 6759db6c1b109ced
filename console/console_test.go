package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/console"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
)

// TestPages reads every page of the console against real data and checks
// what an operator looks for on it.
func TestPages(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	c := f.client(t)
	var declined int64
	if err := f.db.Pool.QueryRow(t.Context(), "SELECT global_sequence FROM annals.events WHERE event_type = 'payment.declined'").Scan(&declined); err != nil {
		t.Fatal(err)
	}
	pages := []struct {
		path string
		code int
		want []string
	}{
		{"/", 200, []string{`id="head">12<`, "mailer", "running", "Dead letters open", `href="/dead-letters?status=open">1<`, "<polyline points=",
			"<th>Partition</th><th>Kind</th>", `<td class="kind">observer</td>`}},
		{"/streams", 200, []string{"customer-7", "order-5"}},
		{"/streams?prefix=order-", 200, []string{"order-1", "order-5"}},
		{"/streams?prefix=order_", 200, []string{"No stream starts with"}}, // _ is not a wildcard
		{"/streams/order-3", 200, []string{"payment.declined", "order.placed", "card expired", "&#34;carrier&#34;: &#34;dhl&#34;"}},
		{"/streams/order-1", 200, []string{"metadata", "&#34;user&#34;: &#34;alice&#34;"}},
		{"/events", 200, []string{"customer.registered", "order.shipped", "Head of the log: 12"}},
		{"/events?type=payment.*", 200, []string{"payment.declined"}},
		{"/events?after=11", 200, []string{"customer.registered"}},
		{"/events?before=3", 200, []string{`href="/events/1"`, `href="/events/2"`}},
		{"/events/" + strconv.FormatInt(declined, 10), 200, []string{"payment.declined", "&#34;reason&#34;: &#34;card expired&#34;", "order-3"}},
		{"/events/1", 200, []string{"&#34;user&#34;: &#34;alice&#34;", "&#34;lines&#34;: [\n    &#34;book&#34;"}},
		{"/subscribers/mailer", 200, []string{"Partitions", "running", "Failures in progress", "open 1", `Kind: <span id="kind">observer</span>.`}},
		{"/dead-letters", 200, []string{"smtp: 550 mailbox unavailable", "payment.declined", "mailer"}},
		{"/dead-letters?status=resolved", 200, []string{"No dead letters match"}},
		{fmt.Sprintf("/dead-letters/%d", f.dlID), 200, []string{"smtp: 550 mailbox unavailable for order-3", "card expired", "Stack"}},
		{"/scheduler", 200, []string{"nightly-report", "30 2 * * *", "Europe/Berlin", "order.payment_deadline", "1 pending, 0 failed"}},
		{"/instances", 200, []string{"live", "mailer/0"}},
		{"/audit", 200, []string{"No actions recorded yet"}},
		{"/login", 200, []string{"Operator token"}},
		{"/healthz", 200, []string{"ok"}},
		{"/readyz", 200, []string{`"ok":true`, `"head":12`}},
		{"/static/style.css", 200, []string{"--accent"}},
		{"/static/console.js", 200, []string{"EventSource"}},
		{"/events/999", 404, []string{"No event at position 999"}},
		{"/events/x", 400, []string{"want a position"}},
		{"/events?type=ord*", 400, []string{"invalid event type glob"}},
		{"/events?after=-1", 400, []string{"want a position"}},
		{"/dead-letters/999", 404, []string{"No dead letter 999"}},
		{"/dead-letters?status=bogus", 400, []string{"want open, retry"}},
		{"/subscribers/nobody", 404, []string{"No subscriber"}},
		{"/streams/nobody", 404, []string{"No stream"}},
		{"/nothing-here", 404, nil},
		// Input PostgreSQL cannot hold as text is refused, not a 500.
		{"/streams?prefix=%00", 400, []string{"is not text"}},
		{"/streams?after=%FF", 400, []string{"is not text"}},
		{"/events?type=%C3", 400, []string{"is not text"}},
		{"/streams/a%00b", 400, []string{"is not text"}},
	}
	for _, p := range pages {
		code, body := c.get(p.path)
		if code != p.code {
			t.Errorf("GET %s: %d, want %d\n%s", p.path, code, p.code, body)
			continue
		}
		for _, w := range p.want {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s: lacks %q", p.path, w)
			}
		}
	}
	// Anonymous visitors see no action forms.
	if _, body := c.get("/dead-letters"); strings.Contains(body, "retry-selected") {
		t.Error("an anonymous visitor is offered the retry button")
	}
	c.login("ada")
	if _, body := c.get("/dead-letters"); !strings.Contains(body, "retry-selected") || !strings.Contains(body, "ada (operator)") {
		t.Error("a signed-in operator is not offered the retry button")
	}
}

// TestWritesNeedAnOperator: without a principal, with a wrong token or a
// wrong session cookie, every write is refused and changes nothing.
func TestWritesNeedAnOperator(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	before := state(t, f.db)
	anon := f.client(t)
	tok := anon.csrf()
	writes := []struct {
		path string
		form url.Values
	}{
		{"/dead-letters/retry", url.Values{"id": {strconv.FormatInt(f.dlID, 10)}}},
		{"/dead-letters/skip", url.Values{"id": {strconv.FormatInt(f.dlID, 10)}}},
		{"/dead-letters/retry-all", url.Values{"subscriber": {"mailer"}}},
		{"/dead-letters/purge", url.Values{"older_than": {"0s"}, "include_unresolved": {"yes"}, "confirm": {"yes"}}},
		{"/subscribers/mailer/checkpoint", url.Values{"partition": {"0"}, "position": {"0"}, "confirm": {"yes"}}},
		{"/scheduler/tasks/nightly-report/pause", url.Values{}},
	}
	for _, w := range writes {
		w.form.Set("csrf", tok)
		if code, body, _ := anon.post(w.path, w.form); code != http.StatusUnauthorized || !strings.Contains(body, "Sign in") {
			t.Errorf("anonymous POST %s: %d, want 401", w.path, code)
		}
		if code, _, _ := anon.post(w.path, w.form, "Authorization", "Bearer wrong-token-0123456789"); code != http.StatusUnauthorized {
			t.Errorf("wrong bearer POST %s: %d, want 401", w.path, code)
		}
	}
	// A forged session cookie (a name with another's signature) is refused.
	u, _ := url.Parse(f.srv.URL)
	anon.hc.Jar.SetCookies(u, []*http.Cookie{{Name: "annals_session", Value: "ZXZl.9999999999.00ff"}})
	if code, _, _ := anon.post("/dead-letters/retry", url.Values{"csrf": {tok}, "id": {strconv.FormatInt(f.dlID, 10)}}); code != http.StatusUnauthorized {
		t.Errorf("forged session: %d, want 401", code)
	}
	// A wrong token does not sign in.
	if code, _, _ := anon.post("/login", url.Values{"csrf": {tok}, "name": {"eve"}, "token": {"nope"}}); code != http.StatusUnauthorized {
		t.Errorf("login with a wrong token: %d, want 401", code)
	}
	if after := state(t, f.db); after != before {
		t.Errorf("refused writes changed the database:\n%s\n%s", before, after)
	}
}

// TestCSRF: a signed-in operator's write without the form token, with
// another browser's token, or from another origin is refused; a bearer
// token (no ambient credentials) needs none.
func TestCSRF(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	before := state(t, f.db)
	op := f.client(t)
	tok := op.login("ada")
	other := f.client(t).csrf()
	id := strconv.FormatInt(f.dlID, 10)
	for name, tc := range map[string]struct {
		form url.Values
		hdr  []string
	}{
		"NoToken":     {url.Values{"id": {id}}, nil},
		"OtherTokens": {url.Values{"id": {id}, "csrf": {other}}, nil},
		"Garbage":     {url.Values{"id": {id}, "csrf": {"00"}}, nil},
		"CrossOrigin": {url.Values{"id": {id}, "csrf": {tok}}, []string{"Origin", "https://evil.example"}},
	} {
		code, body, _ := op.post("/dead-letters/retry", tc.form, tc.hdr...)
		if code != http.StatusForbidden || !strings.Contains(body, "CSRF") {
			t.Errorf("%s: %d, want 403 naming CSRF", name, code)
		}
	}
	if code, _, _ := op.post("/login", url.Values{"name": {"eve"}, "token": {token}}); code != http.StatusForbidden {
		t.Errorf("login without a CSRF token: %d, want 403", code)
	}
	if after := state(t, f.db); after != before {
		t.Errorf("refused writes changed the database:\n%s\n%s", before, after)
	}
	// The same request with its token goes through.
	if code, body, _ := op.post("/dead-letters/retry", url.Values{"id": {id}, "csrf": {tok}}, "Origin", f.srv.URL); code != http.StatusSeeOther {
		t.Fatalf("retry with the token: %d %s", code, body)
	}
	if s := dlStatus(t, f.db, f.dlID); s == "open" {
		t.Errorf("dead letter still open after a retry")
	}
	// A bearer-token client needs no CSRF token.
	api := f.client(t)
	code, body, _ := api.post("/scheduler/tasks/nightly-report/pause", url.Values{}, "Authorization", "Bearer "+token, "X-Annals-Actor", "deploy-bot")
	if code != http.StatusSeeOther {
		t.Fatalf("bearer pause: %d %s", code, body)
	}
	// The scheme's name is case-insensitive; an actor with a control or
	// bidirectional formatting character (a line break would forge lines
	// in an export of the audit log) is recorded as "token", and refused
	// as a login name.
	if code, body, _ := api.post("/scheduler/tasks/nightly-report/resume", url.Values{}, "Authorization", "bearer "+token, "X-Annals-Actor", "eve\u202egnp.exe"); code != http.StatusSeeOther {
		t.Fatalf("lowercase bearer resume: %d %s", code, body)
	}
	login := f.client(t)
	if code, body, _ := login.post("/login", url.Values{"csrf": {login.csrf()}, "name": {"eve\nadmin"}, "token": {token}}); code != http.StatusBadRequest || !strings.Contains(body, "no control characters") {
		t.Errorf("login as a name with a line break: %d %s", code, body)
	}
	// Without X-Annals-Actor the actor is "token" too (as documented).
	if code, body, _ := api.post("/scheduler/tasks/nightly-report/pause", url.Values{}, "Authorization", "Bearer "+token); code != http.StatusSeeOther {
		t.Fatalf("bearer pause without an actor: %d %s", code, body)
	}
	log := auditLog(t, f.db)
	if len(log) != 4 || log[1].Actor != "deploy-bot" || log[1].Action != "cron.pause" || log[2].Actor != "token" || log[2].Action != "cron.resume" ||
		log[3].Actor != "token" || log[3].Action != "cron.pause" {
		t.Errorf("audit log %+v", log)
	}
}

// TestReadOnly: --read-only shows everything, offers no action and refuses
// every write, even an operator's.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	f := setup(t, &fixtureOpts{readOnly: true})
	before := state(t, f.db)
	op := f.client(t)
	tok := op.login("ada")
	for _, p := range []string{"/dead-letters", fmt.Sprintf("/dead-letters/%d", f.dlID), "/scheduler", "/subscribers/mailer"} {
		code, body := op.get(p)
		if code != 200 || !strings.Contains(body, "read-only") {
			t.Errorf("GET %s: %d, no read-only badge", p, code)
		}
		for _, action := range []string{"retry-selected", "retry-one", "/checkpoint", "/pause", "Purge"} {
			if strings.Contains(body, action) {
				t.Errorf("GET %s offers %q in read-only mode", p, action)
			}
		}
	}
	for _, p := range []string{"/dead-letters/retry", "/dead-letters/skip", "/dead-letters/purge", "/scheduler/tasks/nightly-report/pause", "/subscribers/mailer/checkpoint"} {
		code, body, _ := op.post(p, url.Values{"csrf": {tok}, "id": {strconv.FormatInt(f.dlID, 10)}, "confirm": {"yes"}, "older_than": {"0s"}, "partition": {"0"}, "position": {"0"}})
		if code != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Errorf("POST %s: %d, want 403 read-only", p, code)
		}
	}
	if after := state(t, f.db); after != before {
		t.Errorf("read-only console changed the database:\n%s\n%s", before, after)
	}
}

// TestDatabaseRole: the console's writes need a database role with the
// operator privileges; a runner role (which may change dead letters but
// neither delete them nor write the audit log) reads everything and changes
// nothing,
// an operator role's actions are recorded with its name.
func TestDatabaseRole(t *testing.T) {
	t.Parallel()
	var readerName string
	f := setup(t, &fixtureOpts{pool: func(db *annalstest.DB) *pgxpool.Pool {
		p, name := rolePool(t, db, migrations.Runner)
		readerName = name
		return p
	}})
	before := state(t, f.db)
	op := f.client(t)
	tok := op.login("ada")
	if code, _ := op.get("/"); code != 200 {
		t.Fatalf("a runner role cannot show the overview: %d", code)
	}
	if code, _ := op.get("/scheduler"); code != 200 {
		t.Fatalf("a runner role cannot show the scheduler: %d", code)
	}
	code, body, _ := op.post("/dead-letters/retry", url.Values{"csrf": {tok}, "id": {strconv.FormatInt(f.dlID, 10)}})
	if code != http.StatusForbidden || !strings.Contains(body, "annals grant operator") {
		t.Errorf("retry as %s: %d, want 403 naming the operator grant", readerName, code)
	}
	if after := state(t, f.db); after != before {
		t.Errorf("a runner role changed the database:\n%s\n%s", before, after)
	}

	opPool, opName := rolePool(t, f.db, migrations.Operator)
	con, err := console.New(opPool, &console.Config{Schema: f.db.Schema, AuthToken: token})
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Config.Handler = con
	op = f.client(t)
	tok = op.login("ada")
	f.mailer.failing.Store(false)
	if code, body, _ := op.post("/dead-letters/retry", url.Values{"csrf": {tok}, "id": {strconv.FormatInt(f.dlID, 10)}}); code != http.StatusSeeOther {
		t.Fatalf("retry as an operator role: %d %s", code, body)
	}
	log := auditLog(t, f.db)
	if len(log) != 1 || log[0].Actor != "ada" || log[0].DBRole != opName || log[0].Action != "dlq.retry" {
		t.Errorf("audit log %+v, want ada as %s", log, opName)
	}
	// The operator role may record entries but not rewrite them.
	for _, sql := range []string{"UPDATE annals.audit_log SET actor = 'eve'", "DELETE FROM annals.audit_log", "TRUNCATE annals.audit_log"} {
		if _, err := opPool.Exec(t.Context(), sql); err == nil {
			t.Errorf("%s as an operator role succeeded", sql)
		}
	}
	// Nor forge the time or role of a new one.
	if _, err := opPool.Exec(t.Context(), `INSERT INTO annals.audit_log (actor, db_role, action, at) VALUES ('eve', 'postgres', 'forged', '2000-01-01')`); err != nil {
		t.Fatal(err)
	}
	var role string
	var year int
	if err := f.db.Pool.QueryRow(t.Context(), "SELECT db_role, extract(year FROM at)::int FROM annals.audit_log WHERE action = 'forged'").Scan(&role, &year); err != nil {
		t.Fatal(err)
	}
	if role != opName || year == 2000 {
		t.Errorf("forged entry kept db_role %q, year %d", role, year)
	}
}

// TestActions runs every action through the console against the live
// runner and checks the database and the audit log after each.
func TestActions(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := t.Context()
	op := f.client(t)
	tok := op.login("ada")
	post := func(path string, form url.Values) (int, string) {
		t.Helper()
		form.Set("csrf", tok)
		code, body, hdr := op.post(path, form)
		if code == http.StatusSeeOther {
			loc := hdr.Get("Location")
			u, _ := url.Parse(loc)
			return code, u.Query().Get("done")
		}
		return code, body
	}
	id := strconv.FormatInt(f.dlID, 10)

	t.Run("RetryOne", func(t *testing.T) {
		f.mailer.failing.Store(false)
		code, msg := post("/dead-letters/retry", url.Values{"id": {id}, "next": {"/dead-letters/" + id}})
		if code != http.StatusSeeOther || !strings.Contains(msg, "1 dead letter(s) marked for re-delivery") {
			t.Fatalf("retry: %d %q", code, msg)
		}
		// The live runner re-delivers it.
		annalstest.WaitFor(t, 20*time.Second, func() bool { return dlStatus(t, f.db, f.dlID) == "resolved" })
		if _, body := op.get("/dead-letters/" + id); !strings.Contains(body, "resolved") {
			t.Error("the dead letter's page does not show it resolved")
		}
		// Idempotent: a second retry changes nothing and says so.
		if code, msg := post("/dead-letters/retry", url.Values{"id": {id}}); code != http.StatusSeeOther || !strings.Contains(msg, "Nothing to change") {
			t.Errorf("second retry: %d %q", code, msg)
		}
	})

	t.Run("NoOpenRedirect", func(t *testing.T) {
		for _, next := range []string{"//evil.example/x", "/\\evil.example/x", "https://evil.example/", "/\tevil"} {
			code, _, hdr := op.post("/dead-letters/retry", url.Values{"csrf": {tok}, "id": {id}, "next": {next}})
			if loc := hdr.Get("Location"); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/dead-letters?") {
				t.Errorf("next=%q: %d, Location %q", next, code, loc)
			}
		}
	})

	// More dead letters for the bulk actions: three failures of a new stream.
	f.mailer.failing.Store(true)
	if _, err := f.store.Append(ctx, "order-9", eventstore.NoStream,
		eventstore.EventData{Type: "payment.declined", Data: map[string]int{"n": 1}},
		eventstore.EventData{Type: "payment.declined", Data: map[string]int{"n": 2}},
		eventstore.EventData{Type: "payment.declined", Data: map[string]int{"n": 3}}); err != nil {
		t.Fatal(err)
	}
	var more []int64
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		rows, _ := f.db.Pool.Query(ctx, "SELECT id FROM annals.dead_letters WHERE stream_id = 'order-9' AND status = 'open' ORDER BY id")
		more = more[:0]
		for rows.Next() {
			var n int64
			_ = rows.Scan(&n)
			more = append(more, n)
		}
		rows.Close()
		return len(more) == 3
	})
	s := func(n int64) string { return strconv.FormatInt(n, 10) }
	var skipped time.Time

	t.Run("SkipMany", func(t *testing.T) {
		code, msg := post("/dead-letters/skip", url.Values{"id": {s(more[0]), s(more[1])}})
		if err := f.db.Pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&skipped); err != nil {
			t.Fatal(err)
		}
		if code != http.StatusSeeOther || !strings.Contains(msg, "2 skipped") {
			t.Fatalf("skip: %d %q", code, msg)
		}
		for _, n := range more[:2] {
			if st := dlStatus(t, f.db, n); st != "skipped" {
				t.Errorf("dead letter %d: %s, want skipped", n, st)
			}
		}
	})

	// Skipping released the rest of the stream: the runner re-delivers the
	// third, which fails again and is open once more.
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		var reopened bool
		_ = f.db.Pool.QueryRow(ctx, "SELECT status = 'open' AND updated_at > $2 FROM annals.dead_letters WHERE id = $1", more[2], skipped).Scan(&reopened)
		return reopened
	})

	t.Run("UnknownIDChangesNothing", func(t *testing.T) {
		before := state(t, f.db)
		code, body := post("/dead-letters/retry", url.Values{"id": {s(more[2]), "999999"}})
		if code != http.StatusNotFound {
			t.Errorf("retry with an unknown ID: %d %s", code, body)
		}
		if code, _ := post("/dead-letters/retry", url.Values{"id": {"abc"}}); code != http.StatusBadRequest {
			t.Errorf("retry with a bad ID: %d", code)
		}
		if code, _ := post("/dead-letters/retry", url.Values{}); code != http.StatusBadRequest {
			t.Errorf("retry with no ID: %d", code)
		}
		if after := state(t, f.db); after != before {
			t.Errorf("a failed action changed the database (the known ID or the audit log):\n%s\n%s", before, after)
		}
	})

	t.Run("RetryAll", func(t *testing.T) {
		f.mailer.failing.Store(false)
		code, msg := post("/dead-letters/retry-all", url.Values{"subscriber": {"mailer"}})
		if code != http.StatusSeeOther || !strings.Contains(msg, "1 dead letter(s) of mailer") {
			t.Fatalf("retry-all: %d %q", code, msg)
		}
		annalstest.WaitFor(t, 20*time.Second, func() bool { return dlStatus(t, f.db, more[2]) == "resolved" })
		if code, _ := post("/dead-letters/retry-all", url.Values{"subscriber": {"nobody"}}); code != http.StatusNotFound {
			t.Errorf("retry-all of an unknown subscriber: %d", code)
		}
	})

	t.Run("Purge", func(t *testing.T) {
		if code, body := post("/dead-letters/purge", url.Values{"older_than": {"0s"}}); code != http.StatusBadRequest || !strings.Contains(body, "confirm") {
			t.Errorf("purge without confirmation: %d", code)
		}
		if code, _ := post("/dead-letters/purge", url.Values{"older_than": {"yesterday"}, "confirm": {"yes"}}); code != http.StatusBadRequest {
			t.Errorf("purge with a bad age: %d", code)
		}
		if code, msg := post("/dead-letters/purge", url.Values{"older_than": {"1h"}, "confirm": {"yes"}}); code != http.StatusSeeOther || msg != "Purged 0 dead letter(s)." {
			t.Errorf("purge of nothing that old: %d %q", code, msg)
		}
		// Days, as the CLI and the runbook write them.
		if code, msg := post("/dead-letters/purge", url.Values{"older_than": {"30d"}, "confirm": {"yes"}}); code != http.StatusSeeOther || msg != "Purged 0 dead letter(s)." {
			t.Errorf("purge older than 30d: %d %q", code, msg)
		}
		code, msg := post("/dead-letters/purge", url.Values{"older_than": {"0s"}, "confirm": {"yes"}})
		if code != http.StatusSeeOther || msg != "Purged 4 dead letter(s)." {
			t.Errorf("purge: %d %q", code, msg)
		}
	})

	t.Run("CheckpointSet", func(t *testing.T) {
		var pos, epoch int64
		if err := f.db.Pool.QueryRow(ctx, "SELECT position, epoch FROM annals.checkpoints WHERE subscriber_id = 'mailer'").Scan(&pos, &epoch); err != nil {
			t.Fatal(err)
		}
		if code, _ := post("/subscribers/mailer/checkpoint", url.Values{"partition": {"0"}, "position": {"3"}}); code != http.StatusBadRequest {
			t.Errorf("set without confirmation: %d", code)
		}
		if code, _ := post("/subscribers/mailer/checkpoint", url.Values{"partition": {"0"}, "position": {"100000"}, "confirm": {"yes"}}); code != http.StatusBadRequest {
			t.Errorf("set past the head: %d", code)
		}
		if code, _ := post("/subscribers/nobody/checkpoint", url.Values{"partition": {"0"}, "position": {"1"}, "confirm": {"yes"}}); code != http.StatusNotFound {
			t.Errorf("set of an unknown subscriber: %d", code)
		}
		handled := f.mailer.handled.Load()
		code, msg := post("/subscribers/mailer/checkpoint", url.Values{"partition": {"0"}, "position": {"10"}, "confirm": {"yes"}})
		if code != http.StatusSeeOther || !strings.Contains(msg, fmt.Sprintf("position %d → 10", pos)) {
			t.Fatalf("set: %d %q", code, msg)
		}
		// The runner is fenced off, takes the partition again and re-delivers
		// the events after 10.
		annalstest.WaitFor(t, 20*time.Second, func() bool { return f.mailer.handled.Load() >= handled+(pos-10) })
	})

	t.Run("PauseResume", func(t *testing.T) {
		if code, msg := post("/scheduler/tasks/nightly-report/pause", url.Values{}); code != http.StatusSeeOther || !strings.Contains(msg, "pause done") {
			t.Fatalf("pause: %d %q", code, msg)
		}
		if _, body := op.get("/scheduler"); !strings.Contains(body, "paused") || !strings.Contains(body, "Resume") {
			t.Error("the scheduler page does not show the task paused")
		}
		if code, _ := post("/scheduler/tasks/nightly-report/resume", url.Values{}); code != http.StatusSeeOther {
			t.Fatalf("resume: %d", code)
		}
		if code, _ := post("/scheduler/tasks/nobody/pause", url.Values{}); code != http.StatusNotFound {
			t.Errorf("pause of an unknown task: %d", code)
		}
	})

	t.Run("AuditLog", func(t *testing.T) {
		var actions []string
		for _, a := range auditLog(t, f.db) {
			if a.Actor != "ada" {
				t.Errorf("actor %q, want ada", a.Actor)
			}
			actions = append(actions, a.Action)
		}
		want := "dlq.retry dlq.retry dlq.retry dlq.retry dlq.retry dlq.retry dlq.skip dlq.retry_all dlq.purge dlq.purge dlq.purge checkpoint.set cron.pause cron.resume"
		if got := strings.Join(actions, " "); got != want {
			t.Errorf("audit actions\n got %s\nwant %s", got, want)
		}
		if _, body := op.get("/audit"); !strings.Contains(body, "checkpoint.set") || !strings.Contains(body, "mailer/0") {
			t.Error("the audit page lacks the checkpoint set")
		}
	})
}

// TestFollow reads the live follow (server-sent events): an event appended
// after it started arrives, filtered by type, with its position as the ID.
func TestFollow(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/events/follow?after=12&type=order.*", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	if _, err := f.store.Append(ctx, "customer-8", eventstore.NoStream, eventstore.EventData{Type: "customer.registered", Data: map[string]int{"n": 1}}); err != nil {
		t.Fatal(err)
	}
	res, err := f.store.Append(ctx, "order-10", eventstore.NoStream, eventstore.EventData{Type: "order.placed", Data: map[string]int{"n": 10}})
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	var id, event string
	var data struct {
		Position int64  `json:"position"`
		Type     string `json:"type"`
		Stream   string `json:"stream"`
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &data); err != nil {
				t.Fatal(err)
			}
		}
		if data.Type != "" {
			break
		}
	}
	if event != "append" || data.Type != "order.placed" || data.Stream != "order-10" || data.Position != res.Events[len(res.Events)-1].GlobalSequence || id != strconv.FormatInt(data.Position, 10) {
		t.Fatalf("first followed event: id %s, event %s, %+v (want order-10 at %d)", id, event, data, res.Events[len(res.Events)-1].GlobalSequence)
	}
	if code := getCode(t, f.srv.URL+"/events/follow?type=ord*"); code != http.StatusBadRequest {
		t.Errorf("follow with a bad glob: %d", code)
	}
}

func getCode(t *testing.T, u string) int {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestRunnerHealth: the one-call health handler of a service with a runner
// answers 200 while its subscribers are led and within the lag limit, 503
// when behind or when no live instance leads them.
func TestRunnerHealth(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	h := console.RunnerHealth(f.runner, f.db.Pool, &console.HealthConfig{MaxLagEvents: 5})
	get := func() (int, console.HealthReport) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		var rep console.HealthReport
		if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		return rec.Code, rep
	}
	if code, rep := get(); code != 200 || !rep.OK || len(rep.Partitions) != 1 || rep.Partitions[0].Leader == "" {
		t.Fatalf("healthy runner: %d %+v", code, rep)
	}
	// Behind: the checkpoint moved back past the limit, the runner stopped.
	f.stopRunner()
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		code, rep := get()
		return code == 503 && len(rep.Partitions) == 1 && rep.Partitions[0].Problem == "no live leader"
	})
	if _, err := f.db.Pool.Exec(t.Context(), "UPDATE annals.checkpoints SET position = 0"); err != nil {
		t.Fatal(err)
	}
	if _, rep := get(); rep.Partitions[0].LagEvents != 12 {
		t.Errorf("lag %d, want 12", rep.Partitions[0].LagEvents)
	}

	// With the runner gone, the pages show what an operator must see: a
	// stale instance (nobody expires it now), the subscriber standing by, a
	// timer whose attempts are spent.
	if _, err := f.db.Pool.Exec(t.Context(), `
		INSERT INTO annals.instances (instance_id, host, pid, started_at, last_heartbeat, leads)
		VALUES ('old-host:4242:dead', 'old-host', 4242, now() - interval '2 hours', now() - interval '1 hour',
		        '[{"subscriber": "mailer", "partition": 0, "epoch": 1}]');
		UPDATE annals.timers SET attempts = 5, last_error = 'wrong expected version: stream order-1 is at 2', failed_at = now()`); err != nil {
		t.Fatal(err)
	}
	c := f.client(t)
	for path, wants := range map[string][]string{
		"/instances": {"old-host:4242:dead", "stale", "1h0m0s"},
		"/":          {"standing by", "of 1 registered", `<a href="/instances">0</a>`},
		"/scheduler": {"0 pending, 1 failed", "failed 20", "wrong expected version: stream order-1 is at 2"},
	} {
		code, body := c.get(path)
		if code != 200 {
			t.Fatalf("GET %s: %d", path, code)
		}
		for _, w := range wants {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s lacks %q", path, w)
			}
		}
	}
}

// TestMounted mounts the console in a service's mux under /annals with an
// Authorizer (the service's own login): links and forms stay under the
// mount, the Authorizer's operator may write (recorded under its name), its
// non-operator may not, and the token login is off.
func TestMounted(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	con, err := console.New(f.db.Pool, &console.Config{Schema: f.db.Schema, BasePath: "/annals",
		Authorizer: func(r *http.Request) (console.Principal, bool) {
			switch r.Header.Get("X-User") {
			case "grace":
				return console.Principal{Name: "grace", Operator: true}, true
			case "guest":
				return console.Principal{Name: "guest"}, true
			}
			return console.Principal{}, false
		}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/annals/", http.StripPrefix("/annals", con))
	mux.Handle("/readyz", console.RunnerHealth(f.runner, f.db.Pool, nil))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := &client{t: t, base: srv.URL + "/annals", hc: f.client(t).hc}
	code, body := c.get("/dead-letters")
	if code != 200 || !strings.Contains(body, `href="/annals/dead-letters/`) || !strings.Contains(body, `href="/annals/static/style.css"`) {
		t.Fatalf("mounted page: %d, links not under /annals", code)
	}
	tok := csrfRe.FindStringSubmatch(body)
	if tok == nil {
		t.Fatal("no CSRF token")
	}
	form := url.Values{"csrf": {tok[1]}, "id": {strconv.FormatInt(f.dlID, 10)}}
	if code, _, _ := c.post("/dead-letters/retry", form, "X-User", "guest"); code != http.StatusForbidden {
		t.Errorf("a non-operator's retry: %d, want 403", code)
	}
	if code, _, _ := c.post("/login", url.Values{"csrf": {tok[1]}, "name": {"eve"}, "token": {""}}); code != http.StatusForbidden {
		t.Errorf("token login without a token configured: %d, want 403", code)
	}
	f.mailer.failing.Store(false)
	code, _, hdr := c.post("/dead-letters/retry", form, "X-User", "grace")
	if code != http.StatusSeeOther || !strings.HasPrefix(hdr.Get("Location"), "/annals/dead-letters?") {
		t.Fatalf("operator's retry: %d, Location %q", code, hdr.Get("Location"))
	}
	if log := auditLog(t, f.db); len(log) != 1 || log[0].Actor != "grace" {
		t.Errorf("audit %+v, want grace", log)
	}
	if code := getCode(t, srv.URL+"/readyz"); code != 200 {
		t.Errorf("/readyz of the service: %d", code)
	}
}

// TestConcurrentOperators: eight operators retry the same dead letter at
// once, then eight skip it at once. The dead letter's row lock makes them
// take turns: in each round exactly one request changes it (open → retry,
// then retry → skipped), every request is recorded, and the audit entries
// agree with what happened. (The runner is stopped so that it does not
// re-deliver the dead letter between the rounds.)
func TestConcurrentOperators(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.stopRunner()
	id := strconv.FormatInt(f.dlID, 10)
	ops := make([]*client, 8)
	toks := make([]string, 8)
	for i := range ops {
		ops[i] = f.client(t)
		toks[i] = ops[i].login(fmt.Sprintf("op%d", i))
	}
	round := func(path, want string) {
		t.Helper()
		type res struct {
			code int
			msg  string
		}
		out := make(chan res, len(ops))
		for i, op := range ops {
			go func() {
				req, _ := http.NewRequest(http.MethodPost, op.base+path, strings.NewReader(url.Values{"csrf": {toks[i]}, "id": {id}}.Encode()))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				resp, err := op.hc.Do(req)
				if err != nil {
					out <- res{0, err.Error()}
					return
				}
				resp.Body.Close()
				u, _ := url.Parse(resp.Header.Get("Location"))
				out <- res{resp.StatusCode, u.Query().Get("done")}
			}()
		}
		changed := 0
		for range ops {
			r := <-out
			if r.code != http.StatusSeeOther {
				t.Fatalf("%s: %d %s", path, r.code, r.msg)
			}
			if !strings.HasPrefix(r.msg, "Nothing to change") {
				changed++
			}
		}
		if changed != 1 {
			t.Errorf("%s: %d requests changed the dead letter, want exactly 1", path, changed)
		}
		if st := dlStatus(t, f.db, f.dlID); st != want {
			t.Errorf("after %s: %s, want %s", path, st, want)
		}
	}
	round("/dead-letters/retry", "retry")
	round("/dead-letters/skip", "skipped")
	log := auditLog(t, f.db)
	if len(log) != 16 {
		t.Fatalf("%d audit entries, want 16", len(log))
	}
	changes := map[string]int{}
	for _, a := range log {
		var d struct {
			Retried []int64 `json:"retried"`
			Skipped []int64 `json:"skipped"`
		}
		if err := json.Unmarshal([]byte(a.Detail), &d); err != nil {
			t.Fatal(err)
		}
		if len(d.Retried)+len(d.Skipped) > 0 {
			changes[a.Action]++
		}
	}
	if changes["dlq.retry"] != 1 || changes["dlq.skip"] != 1 || len(changes) != 2 {
		t.Errorf("audit entries recording a change: %v, want one retry and one skip", changes)
	}
}

// slowMailer fails like mailer but is retried an hour later.
type slowMailer struct{ mailer }

func (*slowMailer) Name() string { return "slowmail" }

// TestFailuresInProgress: a subscriber waiting to retry a failed event
// shows it on its page with the attempts, the error and when the runner
// will try again (recorded by the runner from its retry policy).
func TestFailuresInProgress(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	slow := &slowMailer{}
	slow.failing.Store(true)
	r, err := projection.NewRunner(f.db.Pool, &projection.Config{Schema: f.db.Schema, PollInterval: 50 * time.Millisecond,
		ShutdownTimeout: time.Second, Retry: &projection.RetryPolicy{MaxRetries: 3, InitialDelay: time.Hour, MaxDelay: 2 * time.Hour, Jitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(slow, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	var retryAt time.Time
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		return f.db.Pool.QueryRow(t.Context(), `SELECT retry_at FROM annals.failures WHERE subscriber_id = 'slowmail' AND retry_at IS NOT NULL`).Scan(&retryAt) == nil
	})
	if d := time.Until(retryAt); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("retry_at %s is %s away, want about an hour", retryAt, d)
	}
	code, body := f.client(t).get("/subscribers/slowmail")
	if code != 200 {
		t.Fatalf("GET /subscribers/slowmail: %d", code)
	}
	for _, want := range []string{`id="failures"`, "payment.declined", "order-3", "smtp: 550 mailbox unavailable",
		`<td class="next-retry">` + retryAt.UTC().Format("2006-01-02 15:04:05Z") + "</td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("subscriber page lacks %q", want)
		}
	}
}

// TestSubscriberKinds: the overview and a subscriber's page show the kind
// the runner recorded for the name (subscriber_layouts.kind, migration
// 0044), as `annals status` does, and "-" when it is unknown: a name no
// runner since 0044 ran, a role that may not read subscriber_layouts, a
// schema before 0044 (no kind column), where the pages still answer.
func TestSubscriberKinds(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := t.Context()
	f.stopRunner() // the schema changes below are not the runner's
	// A subscriber an older runner ran: no kind recorded.
	if _, err := f.db.Pool.Exec(ctx, `INSERT INTO annals.checkpoints (subscriber_id, partition, position) VALUES ('old', 0, 1)`); err != nil {
		t.Fatal(err)
	}
	kinds := func(c *client, who string, mailer, old string) {
		t.Helper()
		if r := c.row("/", "mailer", "0"); !strings.HasPrefix(r, "mailer 0 "+mailer+" ") {
			t.Errorf("overview's mailer row %s: %q; want kind %s", who, r, mailer)
		}
		if r := c.row("/", "old", "0"); !strings.HasPrefix(r, "old 0 "+old+" ") {
			t.Errorf("overview's old row %s: %q; want kind %s", who, r, old)
		}
		for sub, want := range map[string]string{"mailer": mailer, "old": old} {
			code, body := c.get("/subscribers/" + sub)
			if w := `Kind: <span id="kind">` + want + `</span>.`; code != 200 || !strings.Contains(body, w) {
				t.Errorf("/subscribers/%s %s: %d, lacks %q", sub, who, code, w)
			}
		}
	}
	c := f.client(t)
	kinds(c, "as the owner", "observer", "-")

	// A role that may not read subscriber_layouts (granted by an annals
	// before it could).
	p, role := rolePool(t, f.db, migrations.Reader)
	if _, err := f.db.Pool.Exec(ctx, `REVOKE SELECT ON annals.subscriber_layouts FROM `+role); err != nil {
		t.Fatal(err)
	}
	con, err := console.New(p, &console.Config{Schema: f.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	kinds(&client{t: t, base: srv.URL, hc: srv.Client()}, "as a role that may not read subscriber_layouts", "-", "-")

	// A schema before migration 0044.
	if _, err := f.db.Pool.Exec(ctx, `ALTER TABLE annals.subscriber_layouts DROP COLUMN kind`); err != nil {
		t.Fatal(err)
	}
	kinds(c, "on a schema without kinds", "-", "-")
}
