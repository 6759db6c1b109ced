package console_test

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// TestRetryGoneDeadLetters: a dead letter whose event is no longer in the
// log (removed by a hard delete, truncation or retention and a scavenge;
// here a position past the head) cannot be re-delivered, so a retry skips
// it (deadletter.Change.Gone). The console says so in its message and
// lists it under "gone" in the audit entry, as annals dlq retry does;
// before, the message counted it among the skipped without a word.
func TestRetryGoneDeadLetters(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.stopRunner()
	ctx := t.Context()
	add := func() int64 {
		t.Helper()
		var id int64
		if err := f.db.Pool.QueryRow(ctx, `
			INSERT INTO annals.dead_letters (subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error)
			VALUES ('mailer', gen_random_uuid(), 1000000, 'gone-1', 'order.placed', 'failed', 'boom')
			RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	op := f.client(t)
	tok := op.login("ada")
	post := func(path string, form url.Values) string { t.Helper(); return op.act(tok, path, form) }

	one := add()
	msg := post("/dead-letters/retry", url.Values{"id": {strconv.FormatInt(one, 10)}})
	if want := "Skipped 1 whose event no longer exists in the log"; !strings.Contains(msg, want) ||
		!strings.Contains(msg, strconv.FormatInt(one, 10)+".") {
		t.Errorf("retry: %q; want %q and the ID", msg, want)
	}
	two := add()
	msg = post("/dead-letters/retry-all", url.Values{"subscriber": {"mailer"}})
	if want := "Skipped 1 whose event no longer exists in the log"; !strings.Contains(msg, want) {
		t.Errorf("retry all: %q; want %q", msg, want)
	}
	var gone []string
	for _, e := range auditLog(t, f.db) {
		if i := strings.Index(e.Detail, `"gone": [`); i >= 0 {
			gone = append(gone, e.Action+" "+e.Detail[i:i+strings.Index(e.Detail[i:], "]")+1])
		}
	}
	want := []string{`dlq.retry "gone": [` + strconv.FormatInt(one, 10) + `]`, `dlq.retry_all "gone": [` + strconv.FormatInt(two, 10) + `]`}
	if strings.Join(gone, "; ") != strings.Join(want, "; ") {
		t.Errorf("audit entries' gone: %q; want %q", gone, want)
	}
}
