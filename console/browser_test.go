package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// chromium finds the browser: $ANNALS_CHROMIUM, else chromium (Debian's
// package, which `make test` installs when missing) or Chrome on the PATH.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("ANNALS_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium found: install it (Debian: apt-get install chromium; `make chromium` does it as root) or set ANNALS_CHROMIUM")
	return ""
}

// TestBrowser drives headless Chromium through the console as an operator
// at 3 a.m. would: sign in, open the overview, find a stream, open an
// event, follow the log live, see the dead letter, retry it and watch the
// open count drop to 0 as the runner re-delivers it. It saves a screenshot
// of each page in the test's artifact directory (go test -artifacts keeps
// them) and, when $ANNALS_SCREENSHOTS names a directory, the overview and the
// dead letter there too (`make screenshots` writes docs/screenshots).
func TestBrowser(t *testing.T) {
	f := setup(t, nil)
	artifacts := t.ArtifactDir()
	t.Logf("screenshots in %s", artifacts)

	// The profile directory: Chromium's helper processes may still write to it
	// for a moment after the browser is gone, so it is removed when they stop.
	profile, err := os.MkdirTemp("", "annals-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 860),
	)
	bctx, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
		annalstest.WaitFor(t, 20*time.Second, func() bool { return os.RemoveAll(profile) == nil })
	})
	ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	defer cancel()

	run := func(what string, actions ...chromedp.Action) {
		t.Helper()
		if err := chromedp.Run(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	shots := map[string]bool{}
	shot := func(name string) {
		t.Helper()
		var png []byte
		run("screenshot "+name, chromedp.FullScreenshot(&png, 100))
		if err := os.WriteFile(filepath.Join(artifacts, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
		if dir := os.Getenv("ANNALS_SCREENSHOTS"); dir != "" && (name == "overview" || name == "dead-letter") {
			if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		shots[name] = true
	}
	text := func(sel string) string {
		t.Helper()
		var s string
		run("read "+sel, chromedp.Text(sel, &s, chromedp.ByQuery))
		return strings.TrimSpace(s)
	}
	base := f.srv.URL
	// waitURL waits until the page's address holds part (a navigation the
	// last click started has committed).
	waitURL := func(part string) {
		t.Helper()
		annalstest.WaitFor(t, 15*time.Second, func() bool {
			var loc string
			return chromedp.Run(ctx, chromedp.Location(&loc)) == nil && strings.Contains(loc, part)
		})
	}

	// Sign in with the token.
	run("sign in",
		chromedp.Navigate(base+"/login"),
		chromedp.WaitVisible("#login-name", chromedp.ByQuery),
		chromedp.SendKeys("#login-name", "ada", chromedp.ByQuery),
		chromedp.SendKeys("#login-token", token, chromedp.ByQuery),
		chromedp.Click("#login-submit", chromedp.ByQuery),
		chromedp.WaitVisible("#subscribers", chromedp.ByQuery),
	)
	if who := text("#who"); who != "ada (operator)" {
		t.Fatalf("signed in as %q", who)
	}
	// The overview: head, the subscriber running, one open dead letter.
	if head := text("#head"); head != "12" {
		t.Errorf("head %q, want 12", head)
	}
	if s := text("#subscribers tbody"); !strings.Contains(s, "mailer") || !strings.Contains(s, "running") {
		t.Errorf("subscribers table %q", s)
	}
	if n := text("#dlq-open"); n != "1" {
		t.Errorf("open dead letters %q, want 1", n)
	}
	shot("overview-before")

	// Find a stream by prefix and open it.
	run("find a stream",
		chromedp.Click(`a[href="/streams"]`, chromedp.ByQuery),
		chromedp.WaitVisible("#stream-prefix", chromedp.ByQuery),
		chromedp.SendKeys("#stream-prefix", "order-3", chromedp.ByQuery),
		chromedp.Click("#stream-search", chromedp.ByQuery),
	)
	waitURL("prefix=order-3")
	run("search results", chromedp.WaitVisible("#streams", chromedp.ByQuery))
	if s := text("#streams tbody"); !strings.Contains(s, "order-3") || strings.Contains(s, "order-4") {
		t.Errorf("streams found for order-3: %q", s)
	}
	shot("streams")
	run("open the stream",
		chromedp.Click(`a.stream-link`, chromedp.ByQuery),
		chromedp.WaitVisible("#stream-events", chromedp.ByQuery),
	)
	if s := text("#stream-events tbody"); !strings.Contains(s, "payment.declined") {
		t.Errorf("stream order-3 shows %q", s)
	}
	shot("stream")

	// Open its third event (the declined payment): pretty-printed JSON.
	run("open an event",
		chromedp.Click(`#stream-events tbody tr:nth-child(3) a.event-link`, chromedp.ByQuery),
		chromedp.WaitVisible("#event-data", chromedp.ByQuery),
	)
	if typ := text("#event-type"); typ != "payment.declined" {
		t.Errorf("event type %q", typ)
	}
	if data := text("#event-data"); !strings.Contains(data, "\n  \"reason\": \"card expired\"") {
		t.Errorf("event data not pretty-printed: %q", data)
	}
	shot("event")

	// Follow the log live: an event appended now shows up without a reload.
	run("open the log",
		chromedp.Navigate(base+"/events"),
		chromedp.WaitVisible("#log-events", chromedp.ByQuery),
		chromedp.Click("#follow", chromedp.ByQuery),
	)
	var state string
	run("follow starts", chromedp.Poll(`document.getElementById("follow-state").textContent`, &state,
		chromedp.WithPollingTimeout(10*time.Second)))
	res, err := f.store.Append(ctx, "order-11", eventstore.NoStream, eventstore.EventData{Type: "order.placed", Data: map[string]int{"n": 11}})
	if err != nil {
		t.Fatal(err)
	}
	pos := res.Events[0].GlobalSequence
	var found bool
	run("the followed event arrives", chromedp.Poll(
		fmt.Sprintf(`Array.from(document.querySelectorAll("#log-events a.event-link")).some(a => a.textContent === "%d")`, pos),
		&found, chromedp.WithPollingTimeout(15*time.Second)))
	shot("log-follow")

	// The subscriber, the scheduler, the instances.
	run("subscriber", chromedp.Navigate(base+"/subscribers/mailer"), chromedp.WaitVisible("#partitions", chromedp.ByQuery))
	shot("subscriber")
	run("scheduler", chromedp.Navigate(base+"/scheduler"), chromedp.WaitVisible("#tasks", chromedp.ByQuery))
	shot("scheduler")
	run("instances", chromedp.Navigate(base+"/instances"), chromedp.WaitVisible("#instances", chromedp.ByQuery))
	shot("instances")

	// See the dead letter from the overview's count, open it, retry it.
	run("dead letters",
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible("#dlq-open a", chromedp.ByQuery),
		chromedp.Click("#dlq-open a", chromedp.ByQuery),
		chromedp.WaitVisible("#dead-letters", chromedp.ByQuery),
	)
	if s := text("#dead-letters tbody"); !strings.Contains(s, "smtp: 550 mailbox unavailable") || !strings.Contains(s, "open") {
		t.Errorf("dead letters list %q", s)
	}
	shot("dead-letters")
	run("open the dead letter",
		chromedp.Click("a.dl-link", chromedp.ByQuery),
		chromedp.WaitVisible("#dead-letter", chromedp.ByQuery),
	)
	if s := text("#dl-error"); !strings.Contains(s, "smtp: 550 mailbox unavailable for order-3") {
		t.Errorf("dead letter error %q", s)
	}
	shot("dead-letter")
	f.mailer.failing.Store(false) // the mail server is back
	run("retry",
		chromedp.Click("#retry-one", chromedp.ByQuery),
		chromedp.WaitVisible("#flash", chromedp.ByQuery),
	)
	if s := text("#flash"); !strings.Contains(s, "1 dead letter(s) marked for re-delivery") {
		t.Errorf("after retry: %q", s)
	}
	shot("retried")

	// Watch the count drop: the runner re-delivers it and the overview,
	// reloaded, shows no open dead letter.
	run("overview", chromedp.Navigate(base+"/"), chromedp.WaitVisible("#dlq-open", chromedp.ByQuery))
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		var n string
		err := chromedp.Run(ctx, chromedp.Reload(), chromedp.WaitVisible("#dlq-open", chromedp.ByQuery), chromedp.Text("#dlq-open", &n, chromedp.ByQuery))
		return err == nil && strings.TrimSpace(n) == "0"
	})
	if s := dlStatus(t, f.db, f.dlID); s != "resolved" {
		t.Errorf("dead letter %s after the retry, want resolved", s)
	}
	shot("overview")
	run("audit", chromedp.Navigate(base+"/audit"), chromedp.WaitVisible("#audit", chromedp.ByQuery))
	if s := text("#audit tbody"); !strings.Contains(s, "ada") || !strings.Contains(s, "dlq.retry") {
		t.Errorf("audit page %q", s)
	}
	shot("audit")

	for _, name := range []string{"overview-before", "streams", "stream", "event", "log-follow", "subscriber", "scheduler", "instances", "dead-letters", "dead-letter", "retried", "overview", "audit"} {
		st, err := os.Stat(filepath.Join(artifacts, name+".png"))
		if err != nil || st.Size() < 1000 {
			t.Errorf("screenshot %s: %v", name, err)
		}
	}
}
