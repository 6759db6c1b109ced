package cli

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
)

// startUI runs `annals ui ARGS` in-process with $ANNALS_UI_TOKEN set to
// token and returns its base URL, once it serves, and a stop function
// returning its exit code.
func startUI(t *testing.T, url, token string, args ...string) (string, func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := &annalstest.LogBuffer{}, &annalstest.LogBuffer{}
	done := make(chan int, 1)
	getenv := func(k string) string {
		switch k {
		case "DATABASE_URL":
			return url
		case "ANNALS_UI_TOKEN":
			return token
		}
		return ""
	}
	go func() {
		done <- run(ctx, append([]string{"ui", "--listen", "127.0.0.1:0"}, args...), strings.NewReader(""), out, errOut, getenv)
	}()
	re := regexp.MustCompile(`serving (http://\S+)/ `)
	var base string
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
			return true
		}
		select {
		case code := <-done:
			t.Fatalf("annals ui exited %d: %s", code, errOut.String())
		default:
		}
		return false
	})
	stopped, code := false, 0
	stop := func() int {
		if !stopped {
			cancel()
			code, stopped = <-done, true
		}
		return code
	}
	t.Cleanup(func() { stop() })
	return base, stop
}

func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestUI(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	if r := annals(t, db.URL, "append", "order-1", "order.placed", `{"n":1}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}

	t.Run("Serves", func(t *testing.T) {
		base, stop := startUI(t, db.URL, "ui-test-token-0123456789")
		for path, want := range map[string]string{
			"/":                "Head position",
			"/streams/order-1": "order.placed",
			"/healthz":         "ok",
			"/readyz":          `"ok":true`,
			"/metrics":         "annals_head_position 1",
			"/login":           "Operator token",
		} {
			if code, body := httpGet(t, base+path); code != 200 || !strings.Contains(body, want) {
				t.Errorf("GET %s: %d, lacks %q", path, code, want)
			}
		}
		if code := stop(); code != 0 {
			t.Errorf("annals ui exited %d after Ctrl-C, want 0", code)
		}
	})

	t.Run("ReadOnlyUnderBasePath", func(t *testing.T) {
		base, _ := startUI(t, db.URL, "", "--read-only", "--base-path", "/annals")
		if !strings.HasSuffix(base, "/annals") {
			t.Fatalf("base %q", base)
		}
		if code, body := httpGet(t, base+"/"); code != 200 || !strings.Contains(body, "read-only") || !strings.Contains(body, `href="/annals/streams"`) {
			t.Errorf("GET /annals/: %d", code)
		}
		root := strings.TrimSuffix(base, "/annals")
		for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
			if code, _ := httpGet(t, root+p); code != 200 {
				t.Errorf("GET %s beside the base path: %d", p, code)
			}
		}
	})

	t.Run("UsageErrors", func(t *testing.T) {
		for _, args := range [][]string{
			{"ui", "--auth-token", "short"},
			{"ui", "--base-path", "annals"},
			{"ui", "--base-path", "/annals/"},
			{"ui", "--stale-after", "0s"},
			{"ui", "--listen", "127.0.0.1:notaport"},
			{"ui", "extra"},
		} {
			if r := annals(t, db.URL, args...); r.code != ExitUsage {
				t.Errorf("annals %v: exit %d, want %d (%s)", args, r.code, ExitUsage, r.stderr)
			}
		}
	})
}

// ui --help says how long the token must be (shorter is exit 2).
func TestUIHelpTokenLength(t *testing.T) {
	t.Parallel()
	r := annals(t, "", "ui", "--help")
	if r.code != 0 || strings.Count(r.stdout, "at least 16 characters") != 2 {
		t.Fatalf("ui --help should give the token's minimum length in the text and the flag: %+v", r)
	}
	if r := annals(t, "", "ui", "--auth-token", "fifteen-chars!!"); r.code != ExitUsage || !strings.Contains(r.stderr, "at least 16 characters") {
		t.Fatalf("a 15-character token: %+v", r)
	}
}
