package console_test

import (
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/annals-dev/annals/eventstore"
)

// TestLinksAndData: the links that carry a filter carry it once escaped
// (html/template escapes query values itself: escaping them before made
// "order.*" into "order.%252A", and the dead letters' paging links lost
// their filter, so a bulk action on "page 2" acted on every subscriber's
// dead letters), and event data is shown as stored: numbers above 2^53 and
// < > & untouched.
func TestLinksAndData(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	// 105 resolved dead letters of mailer beside the open one: two pages.
	if _, err := f.db.Pool.Exec(t.Context(), `INSERT INTO annals.dead_letters
		(subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error, status)
		SELECT 'mailer', gen_random_uuid(), 1, 'order-1', 'order.placed', 'failed', 'made up', 'resolved'
		  FROM generate_series(1, 105)`); err != nil {
		t.Fatal(err)
	}
	c := f.client(t)
	c.login("ada")
	for _, p := range []string{"/", "/subscribers/mailer", "/events?type=order.*&after=1", "/dead-letters?subscriber=mailer&before=9223372036854775807",
		"/streams?prefix=order-"} {
		code, body := c.get(p)
		if code != 200 {
			t.Fatalf("GET %s: %d", p, code)
		}
		if strings.Contains(body, "%25") {
			t.Errorf("GET %s: a link escaped twice:\n%s", p, line(body, "%25"))
		}
	}
	_, body := c.get("/dead-letters?subscriber=mailer")
	older := html.UnescapeString(line(body, "Older →"))
	if !strings.Contains(older, "/dead-letters?subscriber=mailer&before=") {
		t.Errorf("the Older link of a filtered page: %s", older)
	}
	_, body = c.get(hrefOf(t, older))
	if newer := html.UnescapeString(line(body, "← Newer")); !strings.Contains(newer, "/dead-letters?subscriber=mailer&after=") {
		t.Errorf("the Newer link of a filtered page: %s", newer)
	}
	_, body = c.get("/events?type=order.*&after=1")
	if prev := html.UnescapeString(line(body, "← Previous")); !strings.Contains(prev, "type=order.%2a") && !strings.Contains(prev, "type=order.%2A") && !strings.Contains(prev, "type=order.*") {
		t.Errorf("the Previous link of a filtered log: %s", prev)
	}

	res, err := f.store.Append(t.Context(), "big-1", eventstore.NoStream, eventstore.EventData{Type: "big.number",
		Data: json.RawMessage(`{"order_id": 9007199254740993, "snowflake": 1234567890123456789, "note": "a < b & c"}`)})
	if err != nil {
		t.Fatal(err)
	}
	_, body = c.get("/events/" + strconv.FormatInt(res.Events[0].GlobalSequence, 10))
	text := html.UnescapeString(body)
	for _, want := range []string{"9007199254740993", "1234567890123456789", `"a < b & c"`} {
		if !strings.Contains(text, want) {
			t.Errorf("the event page does not show %s as stored", want)
		}
	}
}

// line returns the first line of s that contains sub.
func line(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// TestSkipCountsEachDeadLetterOnce: skipping a dead letter and the one
// parked behind it releases the second (retry) and then skips it; the
// message and the audit entry count it once, as skipped.
func TestSkipCountsEachDeadLetterOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.stopRunner() // nobody re-delivers meanwhile
	var failed, parked int64
	if err := f.db.Pool.QueryRow(t.Context(), `INSERT INTO annals.dead_letters
		(subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error, status)
		VALUES ('mailer', gen_random_uuid(), 2, 'order-1', 'order.shipped', 'failed', 'made up', 'open') RETURNING id`).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	if err := f.db.Pool.QueryRow(t.Context(), `INSERT INTO annals.dead_letters
		(subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error, status)
		VALUES ('mailer', gen_random_uuid(), 3, 'order-1', 'order.shipped', 'parked', 'behind', 'open') RETURNING id`).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	c := f.client(t)
	tok := c.login("ada")
	code, _, hdr := c.post("/dead-letters/skip", url.Values{"csrf": {tok}, "id": {strconv.FormatInt(failed, 10), strconv.FormatInt(parked, 10)}})
	if code != http.StatusSeeOther {
		t.Fatalf("skip: %d", code)
	}
	u, _ := url.Parse(hdr.Get("Location"))
	if msg := u.Query().Get("done"); !strings.HasPrefix(msg, "0 dead letter(s) marked for re-delivery, 2 skipped") {
		t.Errorf("skip of a dead letter and the one parked behind it: %q", msg)
	}
	var detail string
	if err := f.db.Pool.QueryRow(t.Context(), `SELECT detail::text FROM annals.audit_log WHERE action = 'dlq.skip' ORDER BY id DESC LIMIT 1`).Scan(&detail); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(detail, `"retried": []`) && !strings.Contains(detail, `"retried": null`) {
		t.Errorf("the audit entry lists a skipped dead letter as retried: %s", detail)
	}
}

// TestDoneMessageSigned: a page shows a success message only when this
// console wrote it (after an action); a link with a made-up ?done= shows
// nothing, so nobody can make the console appear to say something.
func TestDoneMessageSigned(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	c := f.client(t)
	tok := c.login("ada")
	const forged = "Purged 5000 dead letters; call 555-0100 now"
	if _, body := c.get("/dead-letters?done=" + url.QueryEscape(forged)); strings.Contains(body, "555-0100") {
		t.Error("a made-up done message is shown")
	}
	code, _, hdr := c.post("/dead-letters/purge", url.Values{"csrf": {tok}, "older_than": {"30d"}, "confirm": {"yes"}})
	if code != http.StatusSeeOther {
		t.Fatalf("purge: %d", code)
	}
	loc := hdr.Get("Location")
	if _, body := c.get(loc); !strings.Contains(body, "Purged 0 dead letter(s).") {
		t.Errorf("the console's own message after a purge is not shown (%s)", loc)
	}
}
