package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/eventstore"
)

// TestBigEventsBounded: a page of the log or of a stream, and the live
// follow, carry the first characters of each event's data and metadata
// (cut in SQL, so big payloads do not cross the wire), with a note of the
// whole size and a link to the event; an event's page shows up to a MiB of
// it, and /events/N/data and /metadata serve it whole.
func TestBigEventsBounded(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := t.Context()
	big, err := eventstore.New(f.db.Pool, &eventstore.Config{Schema: f.db.Schema, MaxEventBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// Six events of 600 KB of data and 100 KB of metadata, then one of 2 MB.
	blob := strings.Repeat("x", 600_000)
	var evs []eventstore.EventData
	for i := range 6 {
		evs = append(evs, eventstore.EventData{Type: "big.blob", Data: map[string]any{"i": i, "blob": blob},
			Metadata: eventstore.Metadata{Extra: map[string]any{"note": strings.Repeat("m", 100_000)}}})
	}
	if _, err := big.Append(ctx, "big", eventstore.NoStream, evs...); err != nil {
		t.Fatal(err)
	}
	res, err := big.Append(ctx, "huge", eventstore.NoStream, eventstore.EventData{Type: "big.huge", Data: map[string]string{"blob": strings.Repeat("y", 2_000_000)}})
	if err != nil {
		t.Fatal(err)
	}
	huge := res.Events[0].GlobalSequence
	var first int64
	var stored string
	if err := f.db.Pool.QueryRow(ctx, "SELECT min(global_sequence) FROM annals.events WHERE stream_id = 'big'").Scan(&first); err != nil {
		t.Fatal(err)
	}
	if err := f.db.Pool.QueryRow(ctx, "SELECT data::text FROM annals.events WHERE global_sequence = $1", first).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	c := f.client(t)
	for _, p := range []string{"/events?after=12", "/streams/big", "/events?before=" + strconv.FormatInt(huge+1, 10), "/events?type=big.*"} {
		code, body := c.get(p)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d", p, code)
		}
		if len(body) > 200_000 {
			t.Errorf("GET %s: %d bytes for 7 events, want them cut", p, len(body))
		}
		if !strings.Contains(body, "Truncated: the data has "+formatBytes(int64(len(stored)))+" in all") ||
			!strings.Contains(body, `href="/events/`+strconv.FormatInt(first, 10)+`">the whole event`) {
			t.Errorf("GET %s: no note of the cut with a link to the event", p)
		}
		if !strings.Contains(body, "Truncated: the metadata has") {
			t.Errorf("GET %s: no note of the metadata's cut", p)
		}
	}
	// An event's page: the data whole (under a MiB), pretty-printed.
	code, body := c.get("/events/" + strconv.FormatInt(first, 10))
	if code != http.StatusOK || !strings.Contains(body, blob) || strings.Contains(body, `id="data-cut"`) {
		t.Errorf("GET /events/%d: %d, the data not whole (%d bytes)", first, code, len(body))
	}
	// Over a MiB: cut, with the raw data linked and served whole.
	code, body = c.get("/events/" + strconv.FormatInt(huge, 10))
	if code != http.StatusOK || len(body) > 1_200_000 || !strings.Contains(body, `id="data-cut"`) ||
		!strings.Contains(body, `href="/events/`+strconv.FormatInt(huge, 10)+`/data"`) {
		t.Errorf("GET /events/%d: %d, %d bytes, want it cut at a MiB with a link to the raw data", huge, code, len(body))
	}
	for _, tc := range []struct {
		path, sql string
	}{
		{"/events/" + strconv.FormatInt(huge, 10) + "/data", "SELECT data::text FROM annals.events WHERE global_sequence = $1"},
		{"/events/" + strconv.FormatInt(first, 10) + "/metadata", "SELECT metadata::text FROM annals.events WHERE global_sequence = $1"},
	} {
		pos, _ := strconv.ParseInt(strings.Split(tc.path, "/")[2], 10, 64)
		var want string
		if err := f.db.Pool.QueryRow(ctx, tc.sql, pos).Scan(&want); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, f.srv.URL+tc.path, nil)
		code, got, hdr := c.do(req)
		if code != http.StatusOK || got != want || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
			t.Errorf("GET %s: %d %q, %d bytes, want the %d stored", tc.path, code, hdr.Get("Content-Type"), len(got), len(want))
		}
	}
	for path, want := range map[string]int{"/events/1/metadata": 200, "/events/999/data": 404, "/events/x/data": 400} {
		if code, _ := c.get(path); code != want {
			t.Errorf("GET %s: %d, want %d", path, code, want)
		}
	}

	// The live follow sends the cut data, with the whole size.
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(fctx, http.MethodGet, f.srv.URL+"/events/follow?after=12", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<10) // a line of a whole event would not fit
	seen := 0
	for seen < 7 && sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var e struct {
			Position  int64  `json:"position"`
			Data      string `json:"data"`
			DataBytes int64  `json:"data_bytes"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatal(err)
		}
		seen++
		if len(e.Data) > 2000 || e.DataBytes < 600_000 || !strings.HasPrefix(e.Data, `{"`) {
			t.Errorf("followed event %d: %d bytes of data, data_bytes %d", e.Position, len(e.Data), e.DataBytes)
		}
	}
	if err := sc.Err(); err != nil || seen != 7 {
		t.Fatalf("follow: %d events, %v", seen, err)
	}
}

// TestLogPositionsNearTheEnd: a page of the log after (or before) a
// position near the largest a bigint holds is an empty page, not a 500
// ("bigint out of range" when the query added the scan window to it).
func TestLogPositionsNearTheEnd(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	c := f.client(t)
	for _, p := range []string{"/events?after=9223372036854700000", "/events?after=9223372036854775807",
		"/events?before=9223372036854775807", "/events?after=9223372036854700000&type=order.*",
		"/streams/order-1?from=9223372036854775807"} {
		if code, body := c.get(p); code != http.StatusOK {
			t.Errorf("GET %s: %d\n%s", p, code, line(body, "error"))
		}
	}
	if code, _ := c.get("/events?after=9223372036854775808"); code != http.StatusBadRequest {
		t.Errorf("a position past a bigint: %d, want 400", code)
	}
	// The page before the largest position holds the log's last events.
	if _, body := c.get("/events?before=9223372036854775807"); !strings.Contains(body, "customer.registered") {
		t.Error("the page before the largest position lacks the newest event")
	}
}

// formatBytes is the console's: 1234567 is "1,234,567 bytes".
func formatBytes(n int64) string {
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteByte(s[i])
	}
	return b.String() + " bytes"
}
