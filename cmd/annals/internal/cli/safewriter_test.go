package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

func TestSafeWriter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"plain text\tand tabs\n", "plain text\tand tabs\n"},
		{"héllo wörld ✓\n", "héllo wörld ✓\n"},
		{"boom \x1b[2J\x1b[31mFAKE\x1b[0m", `boom \u001b[2J\u001b[31mFAKE\u001b[0m`},
		{"x\x1b]0;pwned\x07\r", `x\u001b]0;pwned\u0007\u000d`},
		{"order-1\u202egnp.exe", `order-1\u202egnp.exe`},
		{"\u2066a\u2069 \u200f \u061c", `\u2066a\u2069 \u200f \u061c`},
		{"c1 \u0085 \u009b del \x7f", `c1 \u0085 \u009b del \u007f`},
		{"lone \x9b[2J and \xff", `lone \x9b[2J and \xff`},
	} {
		var b bytes.Buffer
		w := newSafeWriter(&b)
		if _, err := w.Write([]byte(tc.in)); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if b.String() != tc.want {
			t.Errorf("%q: wrote %q, want %q", tc.in, b.String(), tc.want)
		}
	}

	// Written a byte at a time (a bufio.Writer may flush mid-character),
	// the same text comes out.
	in := "a\u202eb é ✓ 𝄞 \x1b[0m\u0085 end"
	var whole, bytewise bytes.Buffer
	w := newSafeWriter(&whole)
	_, _ = w.Write([]byte(in))
	_ = w.Flush()
	w = newSafeWriter(&bytewise)
	for i := range len(in) {
		if n, err := w.Write([]byte{in[i]}); n != 1 || err != nil {
			t.Fatalf("write byte %d: %d, %v", i, n, err)
		}
	}
	_ = w.Flush()
	if whole.String() != bytewise.String() || !strings.Contains(whole.String(), "𝄞") {
		t.Fatalf("whole %q, byte by byte %q", whole.String(), bytewise.String())
	}
	// A character cut off at the end is written, escaped, by Flush.
	var cut bytes.Buffer
	w = newSafeWriter(&cut)
	_, _ = w.Write([]byte("ab\xe2\x80"))
	if cut.String() != "ab" {
		t.Fatalf("before Flush: %q", cut.String())
	}
	_ = w.Flush()
	if cut.String() != `ab\xe2\x80` {
		t.Fatalf("after Flush: %q", cut.String())
	}

	// JSON keeps its meaning: the escapes are JSON's.
	var j bytes.Buffer
	w = newSafeWriter(&j)
	raw, _ := json.Marshal(map[string]string{"s": "order-1\u202egnp.exe \u0085"})
	_, _ = w.Write(raw)
	var back map[string]string
	if err := json.Unmarshal(j.Bytes(), &back); err != nil || back["s"] != "order-1\u202egnp.exe \u0085" {
		t.Fatalf("JSON %s decodes to %q, %v", j.String(), back, err)
	}
}

// TestOutputCannotDriveATerminal: stored text (a stream ID with a
// right-to-left override, a handler's error with escape sequences) is
// printed escaped, in text and in JSON, on stdout and stderr.
func TestOutputCannotDriveATerminal(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	const stream = "order-1\u202egnp.exe"
	if r := annals(t, db.URL, "append", stream, "order.placed", `{"note":"\u001b[2J"}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	if _, err := db.Pool.Exec(t.Context(), `INSERT INTO annals.dead_letters (subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error, error_detail)
		SELECT 'mailer', event_id, global_sequence, stream_id, event_type, 'failed', E'boom \x1b[2J\x1b[31mFAKE: all good\x1b[0m', E'x\x1b]0;pwned\x07'
		  FROM annals.events`); err != nil {
		t.Fatal(err)
	}
	check := func(args []string, r result) {
		t.Helper()
		for _, out := range []string{r.stdout, r.stderr} {
			if strings.ContainsAny(out, "\x1b\x07\u202e") {
				t.Errorf("annals %q printed a control character: %q", args, out)
			}
		}
	}
	for _, args := range [][]string{
		{"read", stream}, {"read", stream, "--output", "json"}, {"read"}, {"tail"}, {"tail", "--output", "jsonl"},
		{"dlq", "list"}, {"dlq", "show", "1"}, {"dlq", "list", "--output", "json"},
		{"stream", "delete", stream + "x"},
	} {
		r := annals(t, db.URL, args...)
		check(args, r)
		if args[0] != "stream" && r.code != 0 {
			t.Errorf("annals %q: %+v", args, r)
		}
		if args[0] == "read" && !strings.Contains(r.stdout, `order-1\u202egnp.exe`) {
			t.Errorf("annals %q: %+v", args, r)
		}
		if args[0] == "dlq" && !strings.Contains(r.stdout, `\u001b[31mFAKE`) && !strings.Contains(r.stdout, `\u001b[2J`) {
			t.Errorf("annals %q: %+v", args, r)
		}
	}
	// JSON output decodes to the stored text.
	r := annals(t, db.URL, "dlq", "list", "--output", "json")
	var list []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 || list[0]["stream_id"] != stream {
		t.Fatalf("dlq list --output json: %v, %+v", err, r)
	}
}
