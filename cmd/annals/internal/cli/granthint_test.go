package cli

import (
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

// TestGrantHints: an operator command PostgreSQL refuses for want of a
// privilege says which grant it needs, and the commands of the log say
// theirs once, under one "annals: " prefix (the new-user trial found raw
// "permission denied" for status, scavenge and archive, and forget's
// prefixes stacked; the CLI audit found it for checkpoint set, dlq purge and
// the schedule commands).
func TestGrantHints(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	writer, writerURL := loginRole(t, db, "w")
	reader, readerURL := loginRole(t, db, "r")
	for kind, role := range map[string]string{"writer": writer, "reader": reader} {
		if r := annals(t, db.URL, "grant", kind, role); r.code != 0 {
			t.Fatalf("grant %s: %+v", kind, r)
		}
	}
	for range 3 {
		if r := annals(t, db.URL, "append", "order-1", "order.placed", `{}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	if r := annals(t, db.URL, "checkpoint", "set", "mailer", "0", "--create", "--yes"); r.code != 0 {
		t.Fatalf("checkpoint set --create: %+v", r)
	}
	for _, c := range []struct {
		url   string
		args  []string
		grant string
		pg    string
	}{
		{writerURL, []string{"status"}, "run 'annals grant reader ROLE' (or runner, operator)", "permission denied for table instances"},
		{writerURL, []string{"scavenge"}, "run 'annals grant operator ROLE'", "permission denied for function scavenge"},
		{readerURL, []string{"scavenge", "--list", "1"}, "run 'annals grant operator ROLE'", "permission denied for table scavenge_runs"},
		{writerURL, []string{"archive", "--before", "3"}, "run 'annals grant operator ROLE'", "permission denied for function archive"},
		{readerURL, []string{"archive", "status"}, "run 'annals grant operator ROLE'", "permission denied for table archive_runs"},
		{readerURL, []string{"forget", "s", "--yes"}, "run 'annals grant writer ROLE'", "permission denied for function forget_subject"},
		{readerURL, []string{"append", "order-1", "order.placed", "{}"}, "run 'annals grant writer ROLE'", "permission denied for function append_one"},
		// The commands of the subscriptions, the dead letters and the
		// scheduler said PostgreSQL's words alone.
		{readerURL, []string{"checkpoint", "set", "mailer", "1", "--yes"}, "run 'annals grant operator ROLE'", "permission denied for table checkpoints"},
		{writerURL, []string{"checkpoint", "set", "mailer", "1", "--yes"}, "run 'annals grant operator ROLE'", "permission denied for table checkpoints"},
		{readerURL, []string{"dlq", "purge", "--older-than", "1d"}, "run 'annals grant operator ROLE'", "permission denied for table dead_letters"},
		{writerURL, []string{"schedule", "list"}, "run 'annals grant reader ROLE' (or runner, operator)", "permission denied for table cron_tasks"},
	} {
		r := annals(t, c.url, c.args...)
		if r.code != ExitFailure || !strings.HasPrefix(r.stderr, "annals: ") || strings.Count(r.stderr, "annals: ") != 1 ||
			!strings.Contains(r.stderr, "the session's role lacks the grants") || !strings.Contains(r.stderr, c.grant) ||
			!strings.Contains(r.stderr, c.pg) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, want 1 with one line that says to %s and has %q: %s", c.args, r.code, c.grant, c.pg, r.stderr)
		}
	}
}
