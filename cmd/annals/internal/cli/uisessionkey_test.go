package cli

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
)

// TestUISessionKeyFile: two `annals ui` given one --session-key-file accept
// each other's forms (replicas behind a load balancer): a sign-in on one
// with the form the other showed succeeds. Given different keys, or none
// (a key random per process), the form is refused (403). A missing file or
// a key under 32 bytes exits 2 naming the flag.
func TestUISessionKeyFile(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	const token = "a-token-of-16-or-more"
	dir := t.TempDir()
	keyFile := func(name, key string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(key), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	shared := keyFile("shared", strings.Repeat("k", 64)+"\n")
	other := keyFile("other", strings.Repeat("o", 64))

	csrfRe := regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	// signIn gets the sign-in form from `from` and posts it to `to` (the
	// cookie jar is per host, so both see the form's cookie).
	signIn := func(from, to string) int {
		t.Helper()
		jar, _ := cookiejar.New(nil)
		hc := &http.Client{Jar: jar, Timeout: 20 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := hc.Get(from + "/login")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m := csrfRe.FindStringSubmatch(string(body))
		if m == nil {
			t.Fatalf("no CSRF token on %s/login", from)
		}
		resp, err = hc.PostForm(to+"/login", url.Values{"csrf": {m[1]}, "name": {"ada"}, "token": {token}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	a, _ := startUI(t, db.URL, token, "--session-key-file", shared)
	b, _ := startUI(t, db.URL, token, "--session-key-file", shared)
	if code := signIn(a, b); code != http.StatusSeeOther {
		t.Errorf("sign-in on b with a's form, one key: %d, want 303", code)
	}
	c, _ := startUI(t, db.URL, token, "--session-key-file", other)
	if code := signIn(a, c); code != http.StatusForbidden {
		t.Errorf("sign-in with the form of a console of another key: %d, want 403", code)
	}
	d, _ := startUI(t, db.URL, token)
	if code := signIn(a, d); code != http.StatusForbidden {
		t.Errorf("sign-in with the form of a console of another key (d has none): %d, want 403", code)
	}

	for _, tc := range []struct{ file, want string }{
		{filepath.Join(dir, "missing"), "--session-key-file"},
		{keyFile("short", strings.Repeat("s", 31)+"\n"), "at least 32"},
	} {
		r := annals(t, db.URL, "ui", "--listen", "127.0.0.1:0", "--session-key-file", tc.file)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("--session-key-file %s: %+v, want exit 2 saying %q", tc.file, r, tc.want)
		}
	}
}
