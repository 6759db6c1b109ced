package console_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// TestMountedWithoutBasePath mounts the console with
// http.StripPrefix("/ops", con) and no Config.BasePath: its links, forms,
// redirects and cookies stay under /ops, the prefix the router took off
// (they pointed at the root, where the service serves something else). At
// the root, unmounted, they stay at the root.
func TestMountedWithoutBasePath(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", f.con))
	mux.Handle("/my%20ops/", http.StripPrefix("/my ops", f.con))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := f.client(t)
	c.base = srv.URL + "/ops"

	req, _ := http.NewRequest(http.MethodGet, c.base+"/dead-letters", nil)
	code, body, hdr := c.do(req)
	if ck := hdr.Get("Set-Cookie"); !strings.Contains(ck, "Path=/ops/") {
		t.Errorf("the CSRF cookie: %q, want Path=/ops/", ck)
	}
	for _, want := range []string{`href="/ops/dead-letters/`, `href="/ops/static/style.css"`, `data-base="/ops"`, `href="/ops/events"`} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("GET /ops/dead-letters: %d, lacks %s", code, want)
		}
	}
	// A link followed from a page deeper down, and the stylesheet.
	_, body = c.get("/dead-letters/" + strconv.FormatInt(f.dlID, 10))
	link := hrefOf(t, line(body, `href="/ops/streams/`))
	if code := getCode(t, srv.URL+link); code != 200 {
		t.Errorf("GET %s: %d", link, code)
	}
	if code := getCode(t, srv.URL+"/ops/static/style.css"); code != 200 {
		t.Errorf("GET /ops/static/style.css: %d", code)
	}

	// The session cookie is set for /ops/, as the CSRF cookie is; the login
	// redirects to /ops/, an action to its page under /ops.
	tok := c.csrf()
	code, _, hdr = c.post("/login", url.Values{"csrf": {tok}, "name": {"ada"}, "token": {token}})
	if code != http.StatusSeeOther || hdr.Get("Location") != "/ops/" || !strings.Contains(hdr.Get("Set-Cookie"), "Path=/ops/") {
		t.Fatalf("login: %d, Location %q, Set-Cookie %q", code, hdr.Get("Location"), hdr.Get("Set-Cookie"))
	}
	f.mailer.failing.Store(false)
	code, _, hdr = c.post("/dead-letters/retry", url.Values{"csrf": {tok}, "id": {strconv.FormatInt(f.dlID, 10)}})
	if code != http.StatusSeeOther || !strings.HasPrefix(hdr.Get("Location"), "/ops/dead-letters?") {
		t.Fatalf("retry: %d, Location %q", code, hdr.Get("Location"))
	}
	if log := auditLog(t, f.db); len(log) != 1 || log[0].Actor != "ada" {
		t.Errorf("audit %+v, want ada", log)
	}

	// At the root, and under a prefix no link could carry unescaped (it
	// is not a possible BasePath): links at the root, as before.
	for _, base := range []string{f.srv.URL, srv.URL + "/my%20ops"} {
		c := f.client(t)
		c.base = base
		if code, body := c.get("/dead-letters"); code != 200 || !strings.Contains(body, `href="/static/style.css"`) || !strings.Contains(body, `data-base=""`) {
			t.Errorf("GET %s/dead-letters: %d, links not at the root", base, code)
		}
	}
}
