package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// tableLines returns the lines of out from the one that starts with header
// up to the first empty line or the line after that does not start a row
// (one that the table did not write: it has no field past the first).
func tableLines(t *testing.T, out, header string) []string {
	t.Helper()
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, header) {
			continue
		}
		end := i + 1
		for end < len(lines) && len(fieldStarts(lines[end])) > 1 {
			end++
		}
		return lines[i:end]
	}
	t.Fatalf("no table %q in:\n%s", header, out)
	return nil
}

// TestStatusTableWide: annals status lines its tables up by display width
// (text/tabwriter counted runes: a CJK subscriber name, instance ID or host
// pushed the columns after it out of line), and a tab in a name does not
// start another cell.
func TestStatusTableWide(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	leader := "注文-runner-1"
	st := &StatusJSON{Schema: "annals", Head: 120,
		Subscribers: []SubscriberStatus{
			{Subscriber: "orders", Position: 100, Head: 120, LagEvents: 20, LagEventsExact: true, LagSeconds: 3, Epoch: 2, Leader: &leader, LockHeld: true},
			{Subscriber: "注文-view", Partition: 1, Position: 120, Head: 120, LagEventsExact: true, Epoch: 12, Leader: &leader, LockHeld: true},
			{Subscriber: "mail\ter", Position: 7, Head: 120, LagEvents: 113, Epoch: 1},
		},
		Instances: []InstanceStatus{
			{InstanceID: "注文-runner-1", Host: "ホスト", PID: 4711, StartedAt: at, LastHeartbeat: at, HeartbeatAgeSeconds: 1.5, Live: true,
				Leads: json.RawMessage(`[{"subscriber": "注文-view", "partition": 1, "epoch": 12}]`)},
			{InstanceID: "runner-2", Host: "db-host-2", PID: 12, StartedAt: at, LastHeartbeat: at, HeartbeatAgeSeconds: 90,
				Leads: json.RawMessage(`[]`)},
		},
	}
	var b bytes.Buffer
	if err := writeStatusTable(&b, st); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "\t") {
		t.Errorf("a tab in the output:\n%s", out)
	}
	subs := tableLines(t, out, "SUBSCRIBER")
	if len(subs) != 4 {
		t.Fatalf("want the header and 3 subscribers:\n%s", out)
	}
	checkAligned(t, subs, 9)
	ins := tableLines(t, out, "INSTANCE")
	if len(ins) != 3 {
		t.Fatalf("want the header and 2 instances:\n%s", out)
	}
	checkAligned(t, ins, 7)
}

// TestScheduleTableWide: annals schedule list lines its tables up by
// display width, as TestStatusTableWide.
func TestScheduleTableWide(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	next, owner, boom := now.Add(time.Hour), "注文-saga", "送信\tに失敗"
	s := &ScheduleJSON{Schema: "annals",
		Tasks: []ScheduleTask{
			{Name: "日次-レポート", Spec: "0 9 * * *", TimeZone: "Asia/Tokyo", StreamID: "報告-1", Missed: "skip", NextTick: &next},
			{Name: "nightly", Spec: "@daily", TimeZone: "UTC", StreamID: "report-2", Missed: "fire_once", Paused: true, LastTick: &now},
		},
		Timers: ScheduleTimers{Pending: 2, Failed: 1, NextDue: &next, List: []ScheduleTimer{
			{ID: "0193a1b2-7c3d-7e4f-8a5b-6c7d8e9f0a1b", DueAt: next, StreamID: "注文-42", Owner: &owner, Events: 3, EventType: "注文.期限切れ"},
			{ID: "0193a1b2-7c3d-7e4f-8a5b-6c7d8e9f0a1c", DueAt: now, StreamID: "order-7", Events: 1, EventType: "order.expired",
				Attempts: 2, LastError: &boom, FailedAt: &now},
		}},
	}
	var b bytes.Buffer
	if err := writeScheduleTable(&b, s, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "\t") {
		t.Errorf("a tab in the output:\n%s", out)
	}
	tasks := tableLines(t, out, "TASK")
	if len(tasks) != 3 {
		t.Fatalf("want the header and 2 tasks:\n%s", out)
	}
	checkAligned(t, tasks, 8)
	timers := tableLines(t, out, "TIMER")
	if len(timers) != 3 {
		t.Fatalf("want the header and 2 timers:\n%s", out)
	}
	checkAligned(t, timers, 8)
	if !strings.Contains(out, "(2 of 3 shown: --limit)") {
		t.Errorf("no --limit line:\n%s", out)
	}
}
