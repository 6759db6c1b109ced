package console_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// TestCheckpointSetBackSettlesDeadLetters: moving a checkpoint back in the
// console delivers the events after it again, so the partition's dead
// letters after the new position are settled as resolved, as `annals
// checkpoint set` does (else a later retry delivers their events a second
// time); the message and the audit entry say how many. Moving forward
// settles none.
func TestCheckpointSetBackSettlesDeadLetters(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.stopRunner() // nobody re-delivers (and dead-letters again) meanwhile
	var dlPos int64
	if err := f.db.Pool.QueryRow(t.Context(), "SELECT global_sequence FROM annals.dead_letters WHERE id = $1", f.dlID).Scan(&dlPos); err != nil {
		t.Fatal(err)
	}
	op := f.client(t)
	tok := op.login("ada")
	var loc string // where the last set redirected to
	set := func(pos string) string {
		t.Helper()
		code, body, hdr := op.post("/subscribers/mailer/checkpoint", url.Values{"csrf": {tok}, "partition": {"0"}, "position": {pos}, "confirm": {"yes"}})
		if code != http.StatusSeeOther {
			t.Fatalf("set to %s: %d %s", pos, code, body)
		}
		loc = hdr.Get("Location")
		u, _ := url.Parse(loc)
		return u.Query().Get("done")
	}
	settled := func() string {
		t.Helper()
		var n string
		if err := f.db.Pool.QueryRow(t.Context(), `SELECT coalesce(detail->>'dead_letters_settled', 'absent') FROM annals.audit_log
			WHERE action = 'checkpoint.set' ORDER BY id DESC LIMIT 1`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	msg := set("12") // where it is: nothing moves back
	if strings.Contains(msg, "settled") || dlStatus(t, f.db, f.dlID) != "open" || settled() != "0" {
		t.Fatalf("a set in place: %q, dead letter %s, settled %s", msg, dlStatus(t, f.db, f.dlID), settled())
	}
	back := dlPos - 2
	msg = set(itoa(back))
	if want := "1 dead letter(s) after position " + itoa(back) + " settled as resolved"; !strings.Contains(msg, want) {
		t.Errorf("set back: %q, want it to say %q", msg, want)
	}
	if s := dlStatus(t, f.db, f.dlID); s != "resolved" {
		t.Errorf("the dead letter after the new position is %s, want resolved", s)
	}
	if n := settled(); n != "1" {
		t.Errorf("audit detail dead_letters_settled = %s, want 1", n)
	}
	if _, body := op.get(loc); !strings.Contains(body, "settled as resolved") {
		t.Error("the subscriber page does not show the settling")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
