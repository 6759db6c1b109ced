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

// browser starts headless Chromium for the test and returns its context,
// which ends after 90 s.
func browser(t *testing.T) context.Context {
	t.Helper()
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
	ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	t.Cleanup(func() {
		cancel()
		cancelBrowser()
		cancelAlloc()
		annalstest.WaitFor(t, 20*time.Second, func() bool { return os.RemoveAll(profile) == nil })
	})
	return ctx
}

// steps runs actions one at a time in the browser of ctx and fails the test
// (naming what) at the first that fails. An action that met chromedp's
// "Could not find node with given id" is run again, up to three times in
// all: the node it had looked up was replaced by a DOM update that came
// between the look-up and the use (seen once, with Chromium starved of CPU
// by a parallel test run), before the action did anything, so running it
// again is what the operator's second click would be.
func steps(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action) {
	t.Helper()
	for _, a := range actions {
		for attempt := 1; ; attempt++ {
			err := chromedp.Run(ctx, a)
			if err != nil && attempt < 3 && strings.Contains(err.Error(), "Could not find node with given id") {
				t.Logf("%s: %v; again", what, err)
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			break
		}
	}
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
	ctx := browser(t)

	run := func(what string, actions ...chromedp.Action) {
		t.Helper()
		steps(t, ctx, what, actions...)
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

// TestBrowserFollow follows the log in Chromium through a database outage:
// the page says the log cannot be read while it cannot (not "following…"),
// and following again once it can; a followed event's text is shown with
// disguising characters escaped and its stream linked even when named
// ".."; and the table keeps the newest rows only (data-keep), dropping the
// oldest.
func TestBrowserFollow(t *testing.T) {
	f, outage := readerFixture(t)
	ctx := browser(t)
	run := func(what string, actions ...chromedp.Action) {
		t.Helper()
		steps(t, ctx, what, actions...)
	}
	// waitJS waits until the JavaScript expression is true.
	waitJS := func(what, expr string) {
		t.Helper()
		var ok bool
		if err := chromedp.Run(ctx, chromedp.Poll(expr, &ok, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
			var state string
			_ = chromedp.Run(ctx, chromedp.Text("#follow-state", &state, chromedp.ByQuery))
			t.Fatalf("%s: %v (follow state %q)", what, err, state)
		}
	}
	const state = `document.getElementById("follow-state")`
	run("open the log and follow",
		chromedp.Navigate(f.srv.URL+"/events"),
		chromedp.WaitVisible("#log-events", chromedp.ByQuery),
		chromedp.Click("#follow", chromedp.ByQuery),
	)
	waitJS("following", state+`.textContent.startsWith("following")`)

	restore := outage()
	waitJS("the outage is shown", state+`.textContent.includes("cannot be read") && `+state+`.classList.contains("failing")`)
	restore()
	waitJS("the recovery is shown", state+`.textContent.startsWith("following") && !`+state+`.classList.contains("failing")`)

	res, err := f.store.Append(ctx, "..", eventstore.NoStream, eventstore.EventData{Type: "odd.\u202eplaced", Data: map[string]string{"n": "\u202e"}})
	if err != nil {
		t.Fatal(err)
	}
	pos := res.Events[0].GlobalSequence
	row := fmt.Sprintf(`Array.from(document.querySelectorAll("#log-events tbody tr")).find(tr => tr.querySelector("a.event-link").textContent === "%d")`, pos)
	waitJS("the followed event arrives", row+` !== undefined`)
	var href, typ string
	run("read the followed row",
		chromedp.Evaluate(row+`.cells[1].querySelector("a").getAttribute("href")`, &href),
		chromedp.Evaluate(row+`.cells[3].textContent`, &typ),
	)
	if href != "/streams/%2E%2E" {
		t.Errorf("the followed event of stream .. links %q", href)
	}
	if typ != `odd.\u202eplaced` {
		t.Errorf("the followed event's type shows as %q", typ)
	}

	// More events than the table keeps: the oldest rows go.
	var keep int
	run("read data-keep", chromedp.Evaluate(`parseInt(document.getElementById("follow").dataset.keep, 10)`, &keep))
	var last int64
	for range 2 {
		var evs []eventstore.EventData
		for i := range keep/2 + 20 {
			evs = append(evs, eventstore.EventData{Type: "bulk.added", Data: map[string]int{"i": i}})
		}
		res, err := f.store.Append(ctx, "bulk", eventstore.Any, evs...)
		if err != nil {
			t.Fatal(err)
		}
		last = res.Events[len(res.Events)-1].GlobalSequence
	}
	waitJS("the last bulk event arrives", fmt.Sprintf(`(() => { const r = document.querySelectorAll("#log-events tbody tr");
		return r.length > 0 && r[r.length-1].querySelector("a.event-link").textContent === "%d"; })()`, last))
	var rows int
	var first string
	run("count the rows",
		chromedp.Evaluate(`document.querySelectorAll("#log-events tbody tr").length`, &rows),
		chromedp.Evaluate(`document.querySelector("#log-events tbody tr a.event-link").textContent`, &first),
	)
	if rows != keep || first != fmt.Sprint(last-int64(keep)+1) {
		t.Errorf("the followed table holds %d rows from position %s, want the newest %d (from %d)", rows, first, keep, last-int64(keep)+1)
	}
}
