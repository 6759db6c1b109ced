package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// fieldStarts is the display column at which each field of a text table's
// line starts: fields are separated by two spaces or more (a field may hold
// one space, as JSON data does).
func fieldStarts(line string) []int {
	var starts []int
	col, spaces := 0, 2
	for _, r := range line {
		if r == ' ' {
			spaces++
		} else {
			if spaces >= 2 {
				starts = append(starts, col)
			}
			spaces = 0
		}
		col += runeWidth(r)
	}
	return starts
}

// checkAligned fails unless every line's first n fields start where the
// first line's do.
func checkAligned(t *testing.T, lines []string, n int) {
	t.Helper()
	want := fieldStarts(lines[0])
	if len(want) < n {
		t.Fatalf("first line %q has %d fields, want %d", lines[0], len(want), n)
	}
	for _, l := range lines[1:] {
		got := fieldStarts(l)
		if len(got) < n || fmt.Sprint(got[:n]) != fmt.Sprint(want[:n]) {
			t.Errorf("not aligned: fields at %v, want %v:\n%s", got, want[:n], strings.Join(lines, "\n"))
			return
		}
	}
}

func TestDisplayWidth(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]int{
		"":                   0,
		"abc":                3,
		"é":                  1, // one code point
		"e\u0301":            1, // e and a combining acute accent
		"日本語":                6,
		"ｱ":                  1, // halfwidth katakana
		"Ａ":                  2, // fullwidth A
		"😀":                  2,
		"a\u200bb":           2,  // zero-width space
		"\xc3":               1,  // not UTF-8
		"\u202eevil\u202c":   4,  // bidi controls take no column
		"\x1b[31mred\x1b[0m": 10, // ESC takes none, the rest prints
		"\u00a0non-breaking": 13,
	} {
		if got := displayWidth(s); got != want {
			t.Errorf("displayWidth(%q) = %d, want %d", s, got, want)
		}
	}
}

func TestTruncateWidth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s     string
		width int
		want  string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"eleven char", 10, "eleven ..."},
		{strings.Repeat("é", 60), 10, strings.Repeat("é", 7) + "..."},
		{`["` + strings.Repeat("é", 60) + `"]`, 80, `["` + strings.Repeat("é", 60) + `"]`},
		{strings.Repeat("日", 10), 9, "日日日..."}, // 6 columns of 日 fit before the ellipsis
		{strings.Repeat("日", 10), 6, "日..."},   // a half of 日 does not fit
		{strings.Repeat("e\u0301", 20), 6, strings.Repeat("e\u0301", 3) + "..."},
		{"ab\xc3\xc3cdefgh", 6, "ab\xc3..."}, // bytes that are not UTF-8 are cut as they are, one a column
	} {
		got := truncateWidth(tc.s, tc.width, "...")
		if got != tc.want {
			t.Errorf("truncateWidth(%q, %d) = %q, want %q", tc.s, tc.width, got, tc.want)
		}
		if displayWidth(got) > tc.width {
			t.Errorf("truncateWidth(%q, %d) = %q: %d columns", tc.s, tc.width, got, displayWidth(got))
		}
		if utf8.ValidString(tc.s) && !utf8.ValidString(got) {
			t.Errorf("truncateWidth(%q, %d) = %q: split a character", tc.s, tc.width, got)
		}
	}
}

// TestFollowedTableAligned: a followed tail prints each row as it comes,
// in fixed columns; a value too wide for its column widens it for the rows
// after. Each row used to be flushed through the tabwriter on its own, so
// only the header and the first row lined up.
func TestFollowedTableAligned(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ev := func(seq int64, stream, typ, data string) eventstore.Event {
		return eventstore.Event{GlobalSequence: seq, StreamID: stream, StreamVersion: 1, Type: typ, Data: json.RawMessage(data), RecordedAt: at}
	}
	var out bytes.Buffer
	w := newEventWriter(&out, outputText, true)
	lines := func() []string { return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") }
	for _, e := range []eventstore.Event{
		ev(1, "order-1234567890", "order.placed", `{"total": 1}`),
		ev(2, "a", "x", `{}`),
		ev(12345, "注文-42", "注文.作成", `{"品": "茶"}`),
		ev(1234567890, "b", "order.shipped", `[1, 2]`),
	} {
		if err := w.write(e); err != nil {
			t.Fatal(err)
		}
		if err := w.flush(); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(lines()); n != 5 {
		t.Fatalf("%d lines, want the header and 4 rows:\n%s", n, out.String())
	}
	checkAligned(t, lines(), 6)
	if strings.Contains(out.String(), "\t") {
		t.Errorf("a tab in the table:\n%s", out.String())
	}

	// A stream ID wider than its column: the rows from it on line up.
	long := strings.Repeat("s", 40)
	for i, stream := range []string{long, "c", "d"} {
		if err := w.write(ev(int64(20+i), stream, "order.placed", `{}`)); err != nil {
			t.Fatal(err)
		}
		if err := w.flush(); err != nil {
			t.Fatal(err)
		}
	}
	all := lines()
	checkAligned(t, all[:5], 6)
	checkAligned(t, all[5:], 6)
	if got, want := fieldStarts(all[6])[2], fieldStarts(all[0])[2]+len(long)-eventColumns[1]; got != want {
		t.Errorf("after a %d-column stream ID, VERSION starts at %d, want %d:\n%s", len(long), got, want, out.String())
	}
}

// TestTailFollowAligned runs `annals tail --from N --follow` and its
// --subscriber form over events whose stream IDs differ in width: every
// row lines up with the header.
func TestTailFollowAligned(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for _, stream := range []string{"order-123456789", "a", "payment-98", "b"} {
		if r := annals(t, db.URL, "append", stream, "order.placed", `{"n": 1}`); r.code != ExitOK {
			t.Fatalf("append: %+v", r)
		}
	}
	for _, args := range [][]string{
		{"--from", "1", "--follow"},
		{"--follow", "--subscriber", "aligned"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out, stop := startTail(t, db.URL, args...)
			annalstest.WaitFor(t, 20*time.Second, func() bool { return strings.Count(out.String(), "\n") >= 5 })
			if code := stop(); code != ExitOK {
				t.Fatalf("tail %q exited %d", args, code)
			}
			lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			if len(lines) != 5 || !strings.HasPrefix(lines[0], "POSITION") {
				t.Fatalf("tail %q: want the header and 4 rows:\n%s", args, out.String())
			}
			checkAligned(t, lines, 6)
		})
	}
}

// TestReadTextCutsData: the text table cuts data wider than 80 columns at a
// character boundary. It cut data longer than 80 bytes at byte 77, which
// split "é" and printed a lone byte 0xc3 (and cut 64 columns of "é" that
// fit), and counted CJK as one column a byte.
func TestReadTextCutsData(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for i, data := range []string{
		`["` + strings.Repeat("é", 90) + `"]`,
		`{"note": "` + strings.Repeat("日本", 30) + `"}`,
		`["` + strings.Repeat("é", 60) + `"]`,
	} {
		stream := []string{"s", "注文-1", "s-2"}[i] // the columns after a CJK stream ID line up too
		if r := annals(t, db.URL, "append", stream, "note.added", data); r.code != ExitOK {
			t.Fatalf("append: %+v", r)
		}
	}
	r := annals(t, db.URL, "read")
	if r.code != ExitOK {
		t.Fatalf("read: %+v", r)
	}
	if !utf8.ValidString(r.stdout) {
		t.Fatalf("read printed bytes that are not UTF-8:\n%q", r.stdout)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("want the header and 3 rows:\n%s", r.stdout)
	}
	checkAligned(t, lines, 6)
	for i, l := range lines[1:] {
		data := l[strings.LastIndex(l, "  ")+2:]
		if w := displayWidth(data); w > eventDataWidth {
			t.Errorf("row %d: data %q is %d columns wide, want at most %d", i+1, data, w, eventDataWidth)
		}
		if i < 2 && !strings.HasSuffix(data, "...") {
			t.Errorf("row %d: long data %q not cut", i+1, data)
		}
	}
	if !strings.HasSuffix(lines[3], `  ["`+strings.Repeat("é", 60)+`"]`) {
		t.Errorf("data that fits in 80 columns was changed: %q", lines[3])
	}
}

// TestTailOutputJSON: without --follow a tail ends, so it can print one
// JSON array (empty: []); with --follow it cannot, and says so.
func TestTailOutputJSON(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	if r := annals(t, db.URL, "tail", "--output", "json"); r.code != ExitOK || r.stdout != "[]\n" {
		t.Fatalf("tail --output json of an empty log: %+v", r)
	}
	for _, stream := range []string{"a", "b"} {
		if r := annals(t, db.URL, "append", stream, "x.y", `{}`); r.code != ExitOK {
			t.Fatalf("append: %+v", r)
		}
	}
	for _, args := range [][]string{{"tail", "--output", "json"}, {"tail", "--subscriber", "js", "--output", "json"}} {
		r := annals(t, db.URL, args...)
		var evs []JSONLEvent
		if err := json.Unmarshal([]byte(r.stdout), &evs); r.code != ExitOK || err != nil || len(evs) != 2 || evs[1].StreamID != "b" {
			t.Errorf("annals %q: %v %+v", args, err, r)
		}
	}
	if r := annals(t, db.URL, "tail", "--follow", "--output", "json"); r.code != ExitUsage || !strings.Contains(r.stderr, "--output jsonl") || r.stdout != "" {
		t.Errorf("tail --follow --output json: %+v", r)
	}
}

// TestDlqListTableCells: the dead-letter table cuts an error to 60 display
// columns (it counted runes, so a CJK message took 120) and makes a tab in
// a cell a space (a tab started a new cell and pushed the rest of the row
// out of its columns).
func TestDlqListTableCells(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ err, want string }{
		{"", "-"},
		{"boom", "boom"},
		{"boom\nstack", "boom …"},
		{"a\tb", "a b"},
		{strings.Repeat("x", 61), strings.Repeat("x", 59) + "…"},
		{strings.Repeat("失敗", 20), strings.Repeat("失敗", 14) + "失…"},
	} {
		got := summary(tc.err)
		if got != tc.want || displayWidth(got) > errorColumnWidth+2 {
			t.Errorf("summary(%q) = %q (%d columns), want %q", tc.err, got, displayWidth(got), tc.want)
		}
	}

	db := annalstest.NewDB(t, nil)
	dlqAdd(t, db, dlqRow{seq: 1, stream: "order\t1", err: "x"})
	dlqAdd(t, db, dlqRow{seq: 2, stream: "order-22", typ: "注文.作成", err: "db\tdown"})
	dlqAdd(t, db, dlqRow{seq: 3, err: strings.Repeat("失敗", 40)})
	r := annals(t, db.URL, "dlq", "list")
	if r.code != ExitOK {
		t.Fatalf("dlq list: %+v", r)
	}
	if strings.Contains(r.stdout, "\t") {
		t.Errorf("a tab in the table:\n%s", r.stdout)
	}
	if !regexp.MustCompile(`  order 1 +1 +order\.placed  `).MatchString(r.stdout) { // stream, position, type: each in its column
		t.Errorf("the stream ID with a tab is not one cell:\n%s", r.stdout)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("want the header and 3 rows:\n%s", r.stdout)
	}
	// Every column lines up, after the wide type too (text/tabwriter
	// counted its runes, not its columns).
	checkAligned(t, lines, 11)
	for _, l := range lines[1:] {
		if i := strings.Index(l, "失"); i >= 0 && displayWidth(l[i:]) > errorColumnWidth {
			t.Errorf("error cell %q wider than %d columns", l[i:], errorColumnWidth)
		}
	}
}
