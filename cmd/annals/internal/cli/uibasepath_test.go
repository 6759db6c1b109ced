package cli

import (
	"strings"
	"testing"
)

// TestUIBasePathRefused: a --base-path that is not path segments of
// letters, digits and - . _ ~ exits 2 naming the flag, before anything
// connects (http.ServeMux panicked on "/a b", an invalid method, and on
// "/a{", a bad wildcard, and read "/{x}" as a wildcard).
func TestUIBasePathRefused(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"/a b", "/a{", "/{x}", "/a/{x...}", "annals", "/annals/", "//a", "/a/../b", "/a%20b", "/é"} {
		r := annals(t, "", "ui", "--listen", "127.0.0.1:0", "--base-path", p)
		if r.code != 2 || !strings.Contains(r.stderr, "--base-path") {
			t.Errorf("--base-path %q: %+v, want exit 2 naming --base-path", p, r)
		}
	}
}
