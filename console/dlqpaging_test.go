package console_test

import (
	"html"
	"regexp"
	"slices"
	"strconv"
	"testing"
)

// hrefOf returns the target of the (first) link in an HTML line, unescaped.
func hrefOf(t *testing.T, l string) string {
	t.Helper()
	m := regexp.MustCompile(`href="([^"]*)"`).FindStringSubmatch(l)
	if m == nil {
		t.Fatalf("no link in %q", l)
	}
	return html.UnescapeString(m[1])
}

var dlLink = regexp.MustCompile(`class="dl-link" href="/dead-letters/(\d+)"`)

// listed returns the IDs of the dead letters a list page shows, in order.
func listed(t *testing.T, body string) []int64 {
	t.Helper()
	var out []int64
	for _, m := range dlLink.FindAllStringSubmatch(body, -1) {
		id, _ := strconv.ParseInt(m[1], 10, 64)
		out = append(out, id)
	}
	return out
}

// TestDeadLetterPagesByCursor: the dead-letter list's Older link leads to
// the page after the one shown, however many dead letters were added or
// purged in between, and Newer back. The links carried an offset: ten dead
// letters added meanwhile made "Older" show ten of the first page again,
// and a purged one made it pass over one.
func TestDeadLetterPagesByCursor(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := t.Context()
	if _, err := f.db.Pool.Exec(ctx, `INSERT INTO annals.dead_letters
		(subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error, status)
		SELECT 'mailer', gen_random_uuid(), 1, 'order-1', 'order.placed', 'failed', 'made up', 'resolved'
		  FROM generate_series(1, 150)`); err != nil {
		t.Fatal(err)
	}
	var all []int64 // newest first
	if err := f.db.Pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id DESC) FROM annals.dead_letters WHERE subscriber_id = 'mailer'`).Scan(&all); err != nil {
		t.Fatal(err)
	}
	c := f.client(t)
	c.login("ada")

	_, body := c.get("/dead-letters?subscriber=mailer")
	first := listed(t, body)
	if !slices.Equal(first, all[:100]) || line(body, "← Newer") != "" {
		t.Fatalf("first page %v (newer link %q), want %v and no newer link", first, line(body, "← Newer"), all[:100])
	}
	older := hrefOf(t, line(body, "Older →"))
	// Meanwhile: ten new dead letters; one of the first page and one not
	// shown yet are purged.
	if _, err := f.db.Pool.Exec(ctx, `INSERT INTO annals.dead_letters
		(subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error, status)
		SELECT 'mailer', gen_random_uuid(), 2, 'order-1', 'order.placed', 'failed', 'newer', 'resolved'
		  FROM generate_series(1, 10)`); err != nil {
		t.Fatal(err)
	}
	var added int64 // the oldest of them
	if err := f.db.Pool.QueryRow(ctx, `SELECT min(id) FROM annals.dead_letters WHERE error = 'newer'`).Scan(&added); err != nil {
		t.Fatal(err)
	}
	gone := all[120]
	if _, err := f.db.Pool.Exec(ctx, `DELETE FROM annals.dead_letters WHERE id = ANY($1)`, []int64{all[5], gone}); err != nil {
		t.Fatal(err)
	}
	code, body := c.get(older)
	second := listed(t, body)
	want := slices.DeleteFunc(slices.Clone(all[100:]), func(id int64) bool { return id == gone })
	if code != 200 || !slices.Equal(second, want) || line(body, "Older →") != "" {
		t.Fatalf("GET %s: %d %v (older link %q), want the rest of the first listing: %v and no older link",
			older, code, second, line(body, "Older →"), want)
	}

	// Newer from there: the 100 just above, the first page's dead letters
	// but the one purged, and the oldest added; newer still the other nine
	// added, too few for a page: the first page is shown.
	code, body = c.get(hrefOf(t, line(body, "← Newer")))
	want = append([]int64{added}, slices.DeleteFunc(slices.Clone(all[:100]), func(id int64) bool { return id == all[5] })...)
	if got := listed(t, body); code != 200 || !slices.Equal(got, want) || line(body, "Older →") == "" {
		t.Fatalf("newer than the second page: %d %v (older link %q), want %v", code, got, line(body, "Older →"), want)
	}
	code, body = c.get(hrefOf(t, line(body, "← Newer")))
	var top []int64
	if err := f.db.Pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id DESC) FROM (SELECT id FROM annals.dead_letters
		WHERE subscriber_id = 'mailer' ORDER BY id DESC LIMIT 100) d`).Scan(&top); err != nil {
		t.Fatal(err)
	}
	if got := listed(t, body); code != 200 || !slices.Equal(got, top) || line(body, "← Newer") != "" || line(body, "Older →") == "" {
		t.Fatalf("the newest: %d %v (newer %q, older %q), want the first page %v", code, got, line(body, "← Newer"), line(body, "Older →"), top)
	}

	for _, p := range []string{"before=0", "before=x", "after=-1", "before=5&after=1"} {
		if code, _ := c.get("/dead-letters?" + p); code != 400 {
			t.Errorf("GET /dead-letters?%s: %d, want 400", p, code)
		}
	}
}
