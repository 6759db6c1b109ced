package console_test

import (
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/plaintext"
)

// TestDisguisingTextShown: stored text with bidirectional formatting or
// control characters (a stream ID with U+202E, a handler error with ESC,
// a subscriber's name, an instance's host) is shown with them escaped as
// \uXXXX, as the command line prints them, on every page that shows it,
// while links keep the real text; a cut never splits a character.
func TestDisguisingTextShown(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := t.Context()
	const stream = "order-1\u202egnp.exe"
	const shown = `order-1\u202egnp.exe`
	const linked = `order-1%E2%80%AEgnp.exe`
	res, err := f.store.Append(ctx, stream, eventstore.NoStream, eventstore.EventData{Type: "order.\u202eplaced",
		Data: map[string]string{"note": "a\u202eb\u2028c"}})
	if err != nil {
		t.Fatal(err)
	}
	pos := res.Events[0].GlobalSequence
	const sub = "mail\u202eer"
	var dl int64
	if err := f.db.Pool.QueryRow(ctx, `INSERT INTO annals.dead_letters
		(subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error, error_detail, status)
		VALUES ($1, $2, $3, $4, $5, 'failed', $6, $7, 'open') RETURNING id`,
		sub, res.Events[0].ID, pos, stream, "order.\u202eplaced", "smtp: \x1b[2Jgone \u202eevil "+strings.Repeat("é", 200),
		"line 1\nline 2\x1b]0;title\x07").Scan(&dl); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Pool.Exec(ctx, `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner, stopped_reason)
		VALUES ($1, 0, 1, 1, $2, $3)`, sub, "host\u202e-1", "halted: \x1b[31mred"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Pool.Exec(ctx, `INSERT INTO annals.subscriber_layouts (subscriber_id, partitions, partition_by, kind)
		VALUES ($1, 1, 'stream', $2)`, sub, "obs\u202eerver"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Pool.Exec(ctx, `INSERT INTO annals.instances (instance_id, host, pid, started_at, last_heartbeat, leads)
		VALUES ($1, $2, 1, now(), now(), jsonb_build_array(jsonb_build_object('subscriber', $3::text, 'partition', 0, 'epoch', 1)))`,
		"inst\u202e-9", "host\u202e-9", sub); err != nil {
		t.Fatal(err)
	}
	c := f.client(t)
	c.login("ada")
	for _, p := range []struct {
		path string
		want []string
	}{
		{"/streams?prefix=order-1", []string{shown, `href="/streams/` + linked + `"`}},
		{"/streams/" + linked, []string{"<h1>Stream " + shown + "</h1>", "<title>Stream " + shown, `order.\u202eplaced`, `a\u202eb\u2028c`}},
		{"/events?after=" + strconv.FormatInt(pos-1, 10), []string{shown, `href="/streams/` + linked + `"`, `order.\u202eplaced`}},
		{"/events/" + strconv.FormatInt(pos, 10), []string{shown, `order.\u202eplaced`, `a\u202eb\u2028c`}},
		{"/dead-letters", []string{shown, `mail\u202eer`, `smtp: \u001b[2Jgone \u202eevil`, `href="/subscribers/mail%E2%80%AEer"`}},
		{"/dead-letters/" + strconv.FormatInt(dl, 10), []string{shown, `mail\u202eer`, `smtp: \u001b[2Jgone \u202eevil`,
			"line 1\nline 2\\u001b]0;title\\u0007", `data-confirm="Skip this event? It will never be delivered to mail\u202eer."`}},
		{"/", []string{`mail\u202eer`, `inst\u202e-9`, `<td class="kind">obs\u202eerver</td>`}},
		{"/subscribers/mail%E2%80%AEer", []string{`<h1>Subscriber mail\u202eer</h1>`, `<span id="kind">obs\u202eerver</span>`, `halted: \u001b[31mred`, `inst\u202e-9`}},
		{"/instances", []string{`inst\u202e-9`, `host\u202e-9`, `mail\u202eer/0`}},
		{"/streams/nobody\u202e", []string{`No stream`}},
	} {
		code, body := c.get(p.path)
		if code != http.StatusOK && !strings.HasPrefix(p.path, "/streams/nobody") {
			t.Errorf("GET %s: %d", p.path, code)
			continue
		}
		for _, w := range p.want {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s: lacks %q", p.path, w)
			}
		}
		if i := strings.IndexFunc(body, func(r rune) bool { return r != '\n' && r != '\t' && plaintext.Disguising(r) }); i >= 0 {
			r, _ := utf8.DecodeRuneInString(body[i:])
			t.Errorf("GET %s: a raw %U is shown: %q", p.path, r, body[max(0, i-40):min(len(body), i+40)])
		}
		if !utf8.ValidString(body) {
			t.Errorf("GET %s: not UTF-8 (a cut split a character)", p.path)
		}
	}
}

// TestDotStreams: streams named "." and ".." are linked as %2E and %2E%2E
// (url.PathEscape leaves dots, and a browser resolves "/streams/.." to
// "/"), and the console serves them there, mounted or not, without a
// redirect.
func TestDotStreams(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for _, s := range []string{".", ".."} {
		if _, err := f.store.Append(t.Context(), s, eventstore.NoStream, eventstore.EventData{Type: "dot.made", Data: map[string]string{"s": s}}); err != nil {
			t.Fatal(err)
		}
	}
	c := f.client(t)
	_, body := c.get("/streams")
	for _, want := range []string{`href="/streams/%2E"`, `href="/streams/%2E%2E"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the streams page lacks %s", want)
		}
	}
	if strings.Contains(body, `href="/streams/."`) || strings.Contains(body, `href="/streams/.."`) {
		t.Error("the streams page links a dot segment")
	}
	_, body = c.get("/events?type=dot.*")
	if !strings.Contains(body, `href="/streams/%2E%2E"`) {
		t.Error("the log links a dot segment")
	}
	for _, p := range []string{"/streams/%2E", "/streams/%2E%2E"} {
		code, body := c.get(p)
		if code != http.StatusOK || !strings.Contains(body, "dot.made") {
			t.Errorf("GET %s: %d", p, code)
		}
	}
	// The console's own redirects after an action keep the escape too.
	if _, err := f.db.Pool.Exec(t.Context(), `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch) VALUES ('..', 0, 1, 1)`); err != nil {
		t.Fatal(err)
	}
	tok := c.login("ada")
	code, _, hdr := c.post("/subscribers/%2E%2E/checkpoint", map[string][]string{"csrf": {tok}, "partition": {"0"}, "position": {"0"}, "confirm": {"yes"}})
	if loc := hdr.Get("Location"); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/subscribers/%2E%2E?") {
		t.Errorf("set the checkpoint of ..: %d, Location %q", code, loc)
	}
	mux := http.NewServeMux()
	mux.Handle("/annals/", http.StripPrefix("/annals", f.con))
	f.srv.Config.Handler = mux
	for _, p := range []string{"/annals/streams/%2E", "/annals/streams/%2E%2E", "/annals/streams/%2e%2e"} {
		code, body := c.get(p)
		if code != http.StatusOK || !strings.Contains(body, "dot.made") {
			t.Errorf("GET %s: %d", p, code)
		}
	}
}

// TestScriptEscapesAsTheServer: console.js shows followed events' text
// with the characters of plaintext.Disguising escaped, as the server's
// pages do: its character class is that set, character for character (a
// JavaScript regular expression without the u flag matches UTF-16 units,
// and every disguising character is in the Basic Multilingual Plane).
func TestScriptEscapesAsTheServer(t *testing.T) {
	t.Parallel()
	js, err := os.ReadFile("static/console.js")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`var disguising = /(\[[^\]]+\])/g;`).FindSubmatch(js)
	if m == nil {
		t.Fatal("console.js has no disguising class")
	}
	class := regexp.MustCompile(`\\u([0-9a-fA-F]{4})`).ReplaceAllString(string(m[1]), `\x{$1}`)
	re, err := regexp.Compile(class)
	if err != nil {
		t.Fatalf("class %s: %v", class, err)
	}
	for r := rune(0); r <= 0xFFFF; r++ {
		if r >= 0xD800 && r <= 0xDFFF {
			continue
		}
		if got, want := re.MatchString(string(r)), plaintext.Disguising(r); got != want {
			t.Errorf("%U: console.js escapes it: %v, plaintext.Disguising: %v", r, got, want)
		}
	}
	for r := rune(0x10000); r <= 0x10FFFF; r++ {
		if plaintext.Disguising(r) {
			t.Fatalf("%U outside the BMP is disguising: console.js cannot match it", r)
		}
	}
}
