package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/scheduler"
)

// annalsAs runs the command line against url with $ANNALS_ACTOR set.
func annalsAs(t *testing.T, url, actor string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	getenv := func(k string) string {
		switch k {
		case "DATABASE_URL":
			return url
		case "ANNALS_ACTOR":
			return actor
		}
		return ""
	}
	code := run(context.Background(), args, strings.NewReader(""), &out, &errOut, getenv)
	return result{code, out.String(), errOut.String()}
}

type auditRow struct {
	Actor, Role, Action, Target string
	Detail                      map[string]any
}

func auditRows(t *testing.T, db *annalstest.DB) []auditRow {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `SELECT actor, db_role, action, target, detail::text FROM annals.audit_log ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []auditRow
	for rows.Next() {
		var r auditRow
		var detail string
		if err := rows.Scan(&r.Actor, &r.Role, &r.Action, &r.Target, &detail); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(detail), &r.Detail); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCLIActionsAudited: the CLI's operator actions are recorded in
// audit_log like the console's, with the actor ($ANNALS_ACTOR, else
// cli:user@host), the database role, the action, target and detail; a role
// that may not write the audit log has the action refused with nothing
// changed. Before, nothing the CLI did left a trace there.
func TestCLIActionsAudited(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	if r := annals(t, db.URL, "append", "order-1", "order.placed", `{}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO annals.dead_letters (subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error)
		SELECT s, event_id, global_sequence, stream_id, event_type, 'failed', 'boom' FROM annals.events, unnest(ARRAY['mailer', 'billing', 'audit']) s`); err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := scheduler.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddTask(ctx, scheduler.Task{Name: "nightly", Spec: "30 2 * * *", StreamID: "reports"}); err != nil {
		t.Fatal(err)
	}

	// A runner may change dead letters, but not write the audit log: refused.
	runner, runnerURL := loginRole(t, db, "auditrunner")
	if err := migrations.Grant(ctx, db.Pool, runner, migrations.Runner, nil); err != nil {
		t.Fatal(err)
	}
	if r := annals(t, runnerURL, "dlq", "retry", "1"); r.code != ExitFailure || !strings.Contains(r.stderr, "annals grant operator") {
		t.Fatalf("dlq retry as a runner: %+v", r)
	}
	var status string
	if err := db.Pool.QueryRow(ctx, `SELECT status FROM annals.dead_letters WHERE id = 1`).Scan(&status); err != nil || status != "open" {
		t.Fatalf("refused retry changed dead letter 1: %s (%v)", status, err)
	}

	// Nor pause a task: it could change the task, but not record it.
	if r := annals(t, runnerURL, "schedule", "pause", "nightly"); r.code != ExitFailure || !strings.Contains(r.stderr, "annals grant operator") {
		t.Fatalf("schedule pause as a runner: %+v", r)
	}
	var paused bool
	if err := db.Pool.QueryRow(ctx, `SELECT paused FROM annals.cron_tasks WHERE name = 'nightly'`).Scan(&paused); err != nil || paused {
		t.Fatalf("refused pause paused the task: %v (%v)", paused, err)
	}
	// A long actor is cut at a character boundary (a cut inside é was
	// refused as invalid UTF-8, and the action with it).
	if r := annalsAs(t, db.URL, strings.Repeat("a", 199)+"é", "checkpoint", "set", "other", "0", "--create", "--yes"); r.code != 0 {
		t.Fatalf("checkpoint set with a long actor: %+v", r)
	}
	sqlExec(t, db, `DELETE FROM annals.checkpoints WHERE subscriber_id = 'other'`)
	if rows := auditRows(t, db); len(rows) != 1 || rows[0].Actor != strings.Repeat("a", 199) {
		t.Fatalf("audit of the long actor: %+v", rows)
	}

	for _, args := range [][]string{
		{"dlq", "retry", "1"},
		{"dlq", "skip", "2"},
		{"dlq", "retry", "--subscriber", "audit", "--all"},
		{"dlq", "purge", "--older-than", "0s"},
		{"checkpoint", "set", "mailer", "1", "--create", "--yes"},
		{"checkpoint", "set", "mailer", "0", "--yes"},
		{"schedule", "pause", "nightly"},
		{"schedule", "resume", "nightly"},
		{"schedule", "delete", "nightly"},
	} {
		if r := annalsAs(t, db.URL, "jane (ticket 42)\nX\u202e", args...); r.code != 0 { // a line break and a bidi override: "?"
			t.Fatalf("annals %q: %+v", args, r)
		}
	}
	// A cancel that cancels nothing (exit 3) records nothing; one that
	// cancels, without $ANNALS_ACTOR, records cli:user@host.
	if r := annals(t, db.URL, "schedule", "cancel", "0191d6a4-0000-7000-8000-0000000000aa"); r.code != ExitNotFound {
		t.Fatalf("schedule cancel of an unknown timer: %+v", r)
	}
	timer, err := s.Schedule(ctx, nil, time.Now().Add(time.Hour), "order-1", eventstore.EventData{Type: "order.expired", Data: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if r := annals(t, db.URL, "schedule", "cancel", timer.String()); r.code != 0 {
		t.Fatalf("schedule cancel: %+v", r)
	}
	rows := auditRows(t, db)[1:] // after the long actor's
	want := []struct{ action, target string }{
		{"dlq.retry", "dead_letters 1"},
		{"dlq.skip", "dead_letters 2"},
		{"dlq.retry_all", "subscriber audit"},
		{"dlq.purge", "dead_letters"},
		{"checkpoint.set", "mailer/0"},
		{"checkpoint.set", "mailer/0"},
		{"cron.pause", "cron_task nightly"},
		{"cron.resume", "cron_task nightly"},
		{"cron.delete", "cron_task nightly"},
		{"timer.cancel", "timer " + timer.String()},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d audit entries, want %d: %+v", len(rows), len(want), rows)
	}
	for i, w := range want {
		r := rows[i]
		if r.Action != w.action || r.Target != w.target {
			t.Errorf("entry %d: %s %q, want %s %q", i, r.Action, r.Target, w.action, w.target)
		}
		if i < len(want)-1 && r.Actor != "jane (ticket 42)?X?" {
			t.Errorf("entry %d: actor %q", i, r.Actor)
		}
		if r.Role == "" {
			t.Errorf("entry %d: no database role", i)
		}
	}
	if a := rows[len(rows)-1].Actor; !strings.HasPrefix(a, "cli:") {
		t.Errorf("actor without $ANNALS_ACTOR: %q, want cli:user@host", a)
	}
	if d := rows[0].Detail; d["retried"] == nil || len(d["retried"].([]any)) != 1 {
		t.Errorf("dlq.retry detail %v", d)
	}
	if d := rows[3].Detail; d["deleted"] != float64(1) || d["include_unresolved"] != false { // the skipped one
		t.Errorf("dlq.purge detail %v", d)
	}
	if d := rows[4].Detail; d["created"] != true || d["to"] != float64(1) {
		t.Errorf("checkpoint.set (create) detail %v", d)
	}
	if d := rows[5].Detail; d["created"] != false || d["from"] != float64(1) || d["to"] != float64(0) {
		t.Errorf("checkpoint.set detail %v", d)
	}
}

// TestAuditDetailListsNeverNull: a list in an audit entry's detail is []
// when empty, never null. A retry that skipped nothing recorded "skipped":
// null (the Change's nil slice) while a skip recorded "retried": [], so a
// reader of the log had to expect both.
func TestAuditDetailListsNeverNull(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		detail any
		want   string
	}{
		{nil, `{}`},
		{map[string]any(nil), `{}`},
		{map[string]any{"ids": []int64{7}, "retried": []int64(nil), "skipped": []int64{}, "names": []string(nil), "n": 0},
			`{"ids":[7],"n":0,"names":[],"retried":[],"skipped":[]}`},
		{[]int64(nil), `null`}, // not a map: as given
	} {
		b, err := json.Marshal(auditDetail(tc.detail))
		if err != nil || string(b) != tc.want {
			t.Errorf("auditDetail(%#v) = %s (%v), want %s", tc.detail, b, err, tc.want)
		}
	}

	db := annalstest.NewDB(t, nil)
	for _, stream := range []string{"order-1", "order-1", "order-2", "order-3"} {
		if r := annals(t, db.URL, "append", stream, "order.placed", `{}`); r.code != ExitOK {
			t.Fatalf("append: %+v", r)
		}
	}
	// mailer: two of order-1's (a retry marks both, skips none); billing:
	// order-2's alone (a skip marks no other for retry); audit: order-3's.
	sqlExec(t, db, `INSERT INTO annals.dead_letters (subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error)
		SELECT s, event_id, global_sequence, stream_id, event_type, 'failed', 'boom'
		  FROM annals.events JOIN (VALUES ('mailer', 'order-1'), ('billing', 'order-2'), ('audit', 'order-3')) v(s, st) ON st = stream_id
		 ORDER BY global_sequence`)
	var mailer, billing int64
	if err := db.Pool.QueryRow(t.Context(), `SELECT min(id) FILTER (WHERE subscriber_id = 'mailer'), min(id) FILTER (WHERE subscriber_id = 'billing')
		FROM annals.dead_letters`).Scan(&mailer, &billing); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"dlq", "retry", fmt.Sprint(mailer)},
		{"dlq", "skip", fmt.Sprint(billing)},
		{"dlq", "retry", "--subscriber", "audit", "--all"},
		{"dlq", "retry", fmt.Sprint(mailer)}, // nothing to do: every list empty
		{"dlq", "retry", "--subscriber", "audit", "--all"},
	} {
		if r := annals(t, db.URL, args...); r.code != ExitOK {
			t.Fatalf("annals %q: %+v", args, r)
		}
	}
	rows := auditRows(t, db)
	if len(rows) != 5 {
		t.Fatalf("%d audit entries, want 5: %+v", len(rows), rows)
	}
	for i, r := range rows {
		for k, v := range r.Detail {
			if v == nil {
				t.Errorf("entry %d (%s): %q is null: %v", i, r.Action, k, r.Detail)
			}
		}
		want := []string{"retried"}
		if r.Action == "dlq.retry" || r.Action == "dlq.skip" {
			want = append(want, "ids", "skipped")
		}
		for _, k := range want {
			if _, ok := r.Detail[k].([]any); !ok {
				t.Errorf("entry %d (%s): %q is %#v, want a list: %v", i, r.Action, k, r.Detail[k], r.Detail)
			}
		}
	}
	if got := rows[0].Detail["retried"].([]any); len(got) != 2 {
		t.Errorf("retry of mailer's: retried %v, want its two", got)
	}
}
