package console_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/console"
	"github.com/annals-dev/annals/migrations"
)

// TestWrongBearerToken: a write with a wrong "Authorization: Bearer" token
// is a failed sign-in, 401 "Wrong token", not a CSRF refusal (which only
// a request without a valid token gets); the right token needs no CSRF
// token, and a request without the header still does.
func TestWrongBearerToken(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	before := state(t, f.db)
	c := f.client(t)
	id := strconv.FormatInt(f.dlID, 10)
	for _, auth := range []string{"Bearer wrong-token-0123456789", "bearer nope", "Bearer "} {
		code, body, _ := c.post("/dead-letters/retry", url.Values{"id": {id}}, "Authorization", auth)
		if code != http.StatusUnauthorized || !strings.Contains(body, "Wrong token") {
			t.Errorf("%q without a CSRF token: %d, want 401 Wrong token\n%s", auth, code, line(body, `id="error"`))
		}
	}
	if code, body, _ := c.post("/dead-letters/retry", url.Values{"id": {id}}); code != http.StatusForbidden || !strings.Contains(body, "CSRF") {
		t.Errorf("no token at all: %d, want 403 CSRF", code)
	}
	if after := state(t, f.db); after != before {
		t.Errorf("refused writes changed the database:\n%s\n%s", before, after)
	}
	if code, body, _ := c.post("/dead-letters/retry", url.Values{"id": {id}}, "Authorization", "Bearer "+token); code != http.StatusSeeOther {
		t.Errorf("the right bearer token: %d %s", code, line(body, `id="error"`))
	}

	// With an Authorizer that accepts the request's own bearer token (a
	// service's login), the header is not "wrong".
	con, err := console.New(f.db.Pool, &console.Config{Schema: f.db.Schema, AuthToken: token,
		Authorizer: func(r *http.Request) (console.Principal, bool) {
			return console.Principal{Name: "svc", Operator: true}, r.Header.Get("Authorization") == "Bearer service-jwt"
		}})
	if err != nil {
		t.Fatal(err)
	}
	f.srv.Config.Handler = con
	if code, body, _ := c.post("/dead-letters/retry", url.Values{"id": {id}}, "Authorization", "Bearer service-jwt"); code == http.StatusUnauthorized {
		t.Errorf("a bearer token the Authorizer accepts: 401 %s", line(body, `id="error"`))
	}
	if code, _, _ := c.post("/dead-letters/retry", url.Values{"id": {id}}, "Authorization", "Bearer other"); code != http.StatusUnauthorized {
		t.Errorf("a bearer token neither accepts: %d, want 401", code)
	}
}

// TestOperatorPrivilegesEach: a database role that holds UPDATE but not
// DELETE on dead_letters is not an operator role: the console says so
// (403) before a purge, rather than failing in the database half-way
// (has_table_privilege with 'UPDATE, DELETE' is true when either is held).
func TestOperatorPrivilegesEach(t *testing.T) {
	t.Parallel()
	var role string
	f := setup(t, &fixtureOpts{pool: func(db *annalstest.DB) *pgxpool.Pool {
		p, name := rolePool(t, db, migrations.Operator)
		role = name
		return p
	}})
	if _, err := f.db.Pool.Exec(t.Context(), "REVOKE DELETE ON annals.dead_letters FROM "+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	before := state(t, f.db)
	op := f.client(t)
	tok := op.login("ada")
	code, body, _ := op.post("/dead-letters/purge", url.Values{"csrf": {tok}, "older_than": {"0s"}, "include_unresolved": {"yes"}, "confirm": {"yes"}})
	if code != http.StatusForbidden || !strings.Contains(body, "lacks the operator privileges") {
		t.Errorf("purge as a role without DELETE: %d, want 403 naming the privileges\n%s", code, line(body, `id="error"`))
	}
	if after := state(t, f.db); after != before {
		t.Errorf("the refused purge changed the database:\n%s\n%s", before, after)
	}
}

// TestBasePathChecked: a BasePath that is not path segments of unreserved
// characters is refused by New (annals ui exits 2 on it): a space or a
// brace would be read by http.ServeMux as a method or a wildcard.
func TestBasePathChecked(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"/a b", "/a{", "/{x}", "/{x...}", "annals", "//a", "/a//b", "/a/../b", "/.", "/a%20b", "/é", "/a?b", "/a#b", "/a\tb", "/a/b c"} {
		if err := console.CheckBasePath(p); err == nil {
			t.Errorf("CheckBasePath(%q) accepted", p)
		}
		if _, err := console.New(nil, &console.Config{BasePath: p}); err == nil || !strings.Contains(err.Error(), "BasePath") {
			t.Errorf("New with BasePath %q: %v", p, err)
		}
	}
	for _, p := range []string{"", "/annals", "/ops/annals", "/a-b_c.d~e/X9"} {
		if err := console.CheckBasePath(p); err != nil {
			t.Errorf("CheckBasePath(%q): %v", p, err)
		}
	}
	if err := console.CheckBasePath("/annals/"); err == nil {
		t.Error("CheckBasePath accepted a trailing /") // New trims it first
	}
}

// TestAuditListsNoneAsEmpty: an audit entry lists no IDs as [], never
// null, whatever the action changed.
func TestAuditListsNoneAsEmpty(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.stopRunner()
	op := f.client(t)
	tok := op.login("ada")
	id := strconv.FormatInt(f.dlID, 10)
	for _, a := range []struct {
		path string
		form url.Values
	}{
		{"/dead-letters/retry", url.Values{"id": {id}}}, // retried one, skipped none
		{"/dead-letters/retry", url.Values{"id": {id}}}, // nothing left to change
		{"/dead-letters/skip", url.Values{"id": {id}}},  // skipped one, retried none
		{"/dead-letters/retry-all", url.Values{"subscriber": {"mailer"}}},
	} {
		a.form.Set("csrf", tok)
		if code, body, _ := op.post(a.path, a.form); code != http.StatusSeeOther {
			t.Fatalf("POST %s: %d %s", a.path, code, line(body, `id="error"`))
		}
	}
	for _, e := range auditLog(t, f.db) {
		if strings.Contains(e.Detail, "null") {
			t.Errorf("%s: detail %s has a null", e.Action, e.Detail)
		}
	}
}
