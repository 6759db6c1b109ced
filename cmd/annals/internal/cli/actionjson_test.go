package cli

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/scheduler"
)

// TestActionsOutputJSON: the commands that change something say what they
// changed in JSON too, for scripts (they refused --output before).
func TestActionsOutputJSON(t *testing.T) {
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
	var failed, parked int64
	dlqLog(t, db, 2) // their events, at positions 1 and 2: one not in the log is not released
	for i, target := range []*int64{&failed, &parked} {
		reason := []string{"failed", "parked"}[i]
		if err := db.Pool.QueryRow(ctx, `INSERT INTO annals.dead_letters
			(subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error)
			VALUES ('mailer', gen_random_uuid(), $1, 'order-1', 'order.placed', $2, 'made up') RETURNING id`, i+1, reason).Scan(target); err != nil {
			t.Fatal(err)
		}
	}
	run := func(v any, args ...string) {
		t.Helper()
		r := annals(t, db.URL, append(args, "--output", "json")...)
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), v) != nil {
			t.Fatalf("annals %v --output json: %+v", args, r)
		}
	}

	var skip ChangeJSON
	run(&skip, "dlq", "skip", strconv.FormatInt(failed, 10))
	if !skip.Changed || skip.Was != "open" || len(skip.Skipped) != 1 || skip.Skipped[0] != failed || len(skip.Retried) != 1 || skip.Retried[0] != parked {
		t.Errorf("dlq skip: %+v; want %d skipped and %d released", skip, failed, parked)
	}
	var again ChangeJSON
	run(&again, "dlq", "retry", strconv.FormatInt(failed, 10))
	if again.Changed || again.Was != "skipped" || again.Retried == nil || again.Skipped == nil {
		t.Errorf("dlq retry of a skipped one: %+v; want nothing changed, empty lists", again)
	}
	var all ChangeJSON
	run(&all, "dlq", "retry", "--subscriber", "mailer", "--all")
	if all.Changed {
		t.Errorf("dlq retry --all with nothing open: %+v", all)
	}
	var purge PurgeJSON
	run(&purge, "dlq", "purge", "--older-than", "0s", "--include-unresolved", "--yes")
	if purge.Purged != 2 || !purge.IncludeUnresolved || purge.Cutoff.IsZero() {
		t.Errorf("dlq purge: %+v", purge)
	}

	var created, moved CheckpointSetJSON
	run(&created, "checkpoint", "set", "audit", "0", "--create", "--yes")
	if !created.Created || created.Subscriber != "audit" || created.Epoch != 1 || created.PreviousPosition != nil {
		t.Errorf("checkpoint set --create: %+v", created)
	}
	run(&moved, "checkpoint", "set", "audit", "0", "--yes")
	if moved.Created || moved.PreviousEpoch == nil || *moved.PreviousEpoch != 1 || moved.Epoch != 2 {
		t.Errorf("checkpoint set: %+v", moved)
	}

	for _, verb := range []string{"pause", "resume", "delete"} {
		var a ScheduleActionJSON
		run(&a, "schedule", verb, "nightly")
		if a.Action != verb+"d" || a.Task != "nightly" {
			t.Errorf("schedule %s: %+v", verb, a)
		}
	}
	var c ScheduleActionJSON
	run(&c, "schedule", "cancel", timer.String())
	if c.Action != "cancelled" || c.Timer != timer.String() {
		t.Errorf("schedule cancel: %+v", c)
	}
}

// TestSetupOutputJSON: migrate (applying) and grant say what they did in
// JSON too, with the keys their --help lists (migrate refused --output
// without --status; grant had no --output).
func TestSetupOutputJSON(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	all, err := migrations.All(nil)
	if err != nil {
		t.Fatal(err)
	}
	const schema = "setup_json"
	run := func(v any, args ...string) {
		t.Helper()
		r := annals(t, db.URL, append(args, "--schema", schema, "--output", "json")...)
		dec := json.NewDecoder(strings.NewReader(r.stdout))
		dec.DisallowUnknownFields()
		if r.code != 0 || dec.Decode(v) != nil {
			t.Fatalf("annals %v --output json: %+v", args, r)
		}
	}

	var first, again MigrateJSON
	run(&first, "migrate")
	if first.Schema != schema || len(first.Applied) != len(all) || first.Applied[0] != (AppliedMigrationJSON{Version: all[0].Version, Name: all[0].Name}) ||
		first.Applied[len(all)-1].Version != all[len(all)-1].Version {
		t.Errorf("migrate of a new schema: %+v", first)
	}
	run(&again, "migrate")
	if again.Schema != schema || again.Applied == nil || len(again.Applied) != 0 {
		t.Errorf("migrate of an up-to-date schema: %+v; want applied []", again)
	}

	role, _ := loginRole(t, db, "json")
	var g GrantJSON
	run(&g, "grant", "writer", role)
	if g.Role != role || g.Kind != "writer" || g.Schema != schema || g.Statements < 1 {
		t.Errorf("grant: %+v", g)
	}

	// --help lists the keys.
	for _, c := range []struct {
		args []string
		keys string
	}{
		{[]string{"migrate", "--help"}, `{"schema", "applied": [{"version", "name"}]}`},
		{[]string{"grant", "--help"}, `{"role", "kind", "schema", "statements"}`},
	} {
		if r := annals(t, "", c.args...); r.code != 0 || !strings.Contains(strings.Join(strings.Fields(r.stdout), " "), c.keys) {
			t.Errorf("annals %q does not list %s: %+v", c.args, c.keys, r)
		}
	}
}
