package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/scheduler"
)

func TestScheduleList(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()

	r := annals(t, db.URL, "schedule", "list")
	if r.code != ExitOK || !strings.Contains(r.stdout, "No cron tasks.") || !strings.Contains(r.stdout, "Timers: 0 pending timers, 0 failed.") {
		t.Fatalf("empty list: %+v", r)
	}

	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := scheduler.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddTask(ctx, scheduler.Task{Name: "nightly", Spec: "30 2 * * *", TimeZone: "Europe/Berlin", StreamID: "reports", Missed: scheduler.SkipMissed}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTask(ctx, scheduler.Task{Name: "minutely", Spec: "* * * * *", StreamID: "ticks"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PauseTask(ctx, "minutely"); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, db, `UPDATE annals.cron_tasks SET last_tick = '2026-01-05 01:30:00Z', active_since = '2026-01-01 00:00:00Z' WHERE name = 'nightly'`)
	e := eventstore.EventData{Type: "order.expired", Data: map[string]any{}}
	due := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	first, err := s.ScheduleTimer(ctx, nil, scheduler.Timer{At: due, StreamID: "order-1", Events: []eventstore.EventData{e, e}, Owner: "saga:o-1"})
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Schedule(ctx, nil, due.Add(time.Hour), "order-2", e)
	if err != nil {
		t.Fatal(err)
	}
	failed, err := s.Schedule(ctx, nil, due, "order-3", e)
	if err != nil {
		t.Fatal(err)
	}
	sqlExec(t, db, `UPDATE annals.timers SET failed_at = '2026-01-01Z', attempts = 5, last_error = 'wrong expected version for stream "order-3"' WHERE id = $1`, failed)

	r = annals(t, db.URL, "schedule", "list")
	if r.code != ExitOK {
		t.Fatalf("list: %+v", r)
	}
	for _, cells := range [][]string{
		{"TASK", "SPEC", "ZONE", "STREAM", "MISSED", "STATE", "NEXT TICK", "LAST FIRED"},
		// The tick after 2026-01-05 02:30 CET is 2026-01-06 02:30 CET: overdue.
		{"nightly", "30 2 * * *", "Europe/Berlin", "reports", "skip_missed", "active", "2026-01-06 01:30:00Z (overdue)", "2026-01-05 01:30:00Z"},
		{"minutely", "* * * * *", "UTC", "ticks", "fire_latest", "paused", "-", "-"},
		{failed.String(), "failed", "2030-01-02 03:04:05Z", "order-3", "-", "order.expired", "5", `wrong expected version for stream "order-3"`},
		{first.String(), "pending", "2030-01-02 03:04:05Z", "order-1", "saga:o-1", "2 × order.expired", "0", "-"},
		{second.String(), "pending", "2030-01-02 04:04:05Z", "order-2", "-", "order.expired", "0", "-"},
	} {
		tableLine(t, r.stdout, strings.Fields(strings.Join(cells, " "))...)
	}
	if !strings.Contains(r.stdout, "Timers: 2 pending timers, next due 2030-01-02 03:04:05Z, 1 failed.") {
		t.Errorf("no timer summary in:\n%s", r.stdout)
	}
	if !(strings.Index(r.stdout, "minutely") < strings.Index(r.stdout, "nightly")) ||
		!(strings.Index(r.stdout, "order-3") < strings.Index(r.stdout, "order-1")) {
		t.Errorf("want tasks by name and failed timers first:\n%s", r.stdout)
	}

	r = annals(t, db.URL, "schedule", "list", "--limit", "1")
	if r.code != ExitOK || !strings.Contains(r.stdout, "(1 of 3 shown: --limit)") || strings.Contains(r.stdout, "order-1") {
		t.Errorf("--limit 1: %+v", r)
	}

	r = annals(t, db.URL, "schedule", "list", "--output", "json")
	if r.code != ExitOK {
		t.Fatalf("json: %+v", r)
	}
	var js ScheduleJSON
	if err := json.Unmarshal([]byte(r.stdout), &js); err != nil {
		t.Fatal(err)
	}
	if js.Schema != "annals" || len(js.Tasks) != 2 || js.Tasks[1].Name != "nightly" || js.Tasks[1].LastTick == nil ||
		js.Tasks[0].NextTick != nil || !js.Tasks[0].Paused || js.Tasks[1].Missed != "skip_missed" {
		t.Errorf("json tasks: %+v", js.Tasks)
	}
	if js.Timers.Pending != 2 || js.Timers.Failed != 1 || js.Timers.NextDue == nil || !js.Timers.NextDue.Equal(due) ||
		len(js.Timers.List) != 3 || js.Timers.List[0].FailedAt == nil || js.Timers.List[1].Owner == nil || js.Timers.List[1].Events != 2 {
		t.Errorf("json timers: %+v", js.Timers)
	}

	for _, args := range [][]string{
		{"schedule"},
		{"schedule", "nope"},
		{"schedule", "list", "extra"},
		{"schedule", "list", "--output", "xml"},
		{"schedule", "list", "--limit", "0"},
		{"schedule", "list", "--limit", "1001"},
	} {
		if r := annals(t, db.URL, args...); r.code != ExitUsage || r.stderr == "" {
			t.Errorf("%v: exit %d, stderr %q; want usage error (2)", args, r.code, r.stderr)
		}
	}
	if r := annals(t, db.URL, "--schema", "elsewhere", "schedule", "list"); r.code != ExitFailure || !strings.Contains(r.stderr, `schema "elsewhere" is missing or not migrated`) {
		t.Errorf("unmigrated schema: %+v", r)
	}
	if r := annals(t, "", "schedule", "list"); r.code != ExitUsage || !strings.Contains(r.stderr, "no database") {
		t.Errorf("no database: %+v", r)
	}
}

// pause, resume, delete and cancel act on the database alone; mistakes exit
// 2, unknown tasks and timers exit 3, and neither changes anything, the
// audit log included.
func TestScheduleManage(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
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
	timer, err := s.Schedule(ctx, nil, time.Now().Add(time.Hour), "order-1", eventstore.EventData{Type: "order.expired", Data: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	paused := func() bool {
		tasks, err := s.Tasks(ctx)
		if err != nil || len(tasks) != 1 {
			t.Fatalf("tasks %+v, %v", tasks, err)
		}
		return tasks[0].Paused
	}

	for _, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"schedule", "pause"}, ExitUsage, ""},
		{[]string{"schedule", "pause", "a", "b"}, ExitUsage, ""},
		{[]string{"schedule", "pause", "nope"}, ExitNotFound, `no cron task "nope"`},
		{[]string{"schedule", "resume", "nope"}, ExitNotFound, `no cron task "nope"`},
		{[]string{"schedule", "delete", "nope"}, ExitNotFound, `no cron task "nope"`},
		{[]string{"schedule", "cancel", "not-a-uuid"}, ExitUsage, "not-a-uuid"},
		{[]string{"schedule", "cancel", "0191d6a4-0000-7000-8000-000000000000"}, ExitNotFound, "no pending timer"},
		{[]string{"schedule", "bogus"}, ExitUsage, "unknown subcommand"},
	} {
		r := annals(t, db.URL, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.out) {
			t.Errorf("%v: %+v; want exit %d mentioning %q", c.args, r, c.code, c.out)
		}
	}
	if paused() {
		t.Fatal("a failed command paused the task")
	}
	if rows := auditRows(t, db); len(rows) != 0 {
		t.Fatalf("failed commands wrote audit entries: %+v", rows)
	}

	if r := annals(t, db.URL, "schedule", "pause", "nightly"); r.code != ExitOK || r.stdout != "paused cron task nightly\n" || !paused() {
		t.Fatalf("pause: %+v (paused %v)", r, paused())
	}
	if r := annals(t, db.URL, "schedule", "resume", "nightly"); r.code != ExitOK || r.stdout != "resumed cron task nightly\n" || paused() {
		t.Fatalf("resume: %+v (paused %v)", r, paused())
	}
	if r := annals(t, db.URL, "schedule", "cancel", timer.String()); r.code != ExitOK || r.stdout != "cancelled timer "+timer.String()+"\n" {
		t.Fatalf("cancel: %+v", r)
	}
	if r := annals(t, db.URL, "schedule", "cancel", timer.String()); r.code != ExitNotFound {
		t.Fatalf("cancel twice: %+v", r)
	}
	// The cancel that did nothing (exit 3) recorded nothing.
	var cancels []auditRow
	for _, r := range auditRows(t, db) {
		if r.Action == "timer.cancel" {
			cancels = append(cancels, r)
		}
	}
	if len(cancels) != 1 || cancels[0].Target != "timer "+timer.String() || cancels[0].Detail["cancelled"] != true {
		t.Fatalf("timer.cancel audit entries %+v; want one, of the cancel that cancelled", cancels)
	}
	if r := annals(t, db.URL, "schedule", "delete", "nightly"); r.code != ExitOK || r.stdout != "deleted cron task nightly\n" {
		t.Fatalf("delete: %+v", r)
	}
	if tasks, err := s.Tasks(ctx); err != nil || len(tasks) != 0 {
		t.Fatalf("after delete: %+v, %v", tasks, err)
	}
	if r := annals(t, db.URL, "schedule", "list"); r.code != ExitOK || !strings.Contains(r.stdout, "No cron tasks.") || !strings.Contains(r.stdout, "0 pending timers") {
		t.Fatalf("list after: %+v", r)
	}
}
