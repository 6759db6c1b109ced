package console_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/console"
	"github.com/annals-dev/annals/eventstore"
)

// TestRetiredGeneration: a retired blue/green generation (bgm#g1, replaced
// by bgm#g2 at a cut-over, kept for a rollback) keeps its checkpoint and the
// cut-over's stop, and nobody runs it, as `annals status` says ("(retired:
// none)", no STOPPED advice). The console showed it as a stopped partition
// with no leader and a growing lag, /readyz listing it unhealthy and
// /metrics with annals_subscriber_led 0 and annals_subscriber_stopped 1,
// firing the alerts on them. It shows it retired, readiness passes it, and
// /metrics has no led, stopped or lag series for it.
func TestRetiredGeneration(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	// As in annals status's test: generation 1 retired by the cut-over to
	// generation 2, which is live (and led by inst-live); events after
	// generation 1's checkpoint.
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO annals.read_model_generations (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by)
		VALUES ('bgm', 1, 1, 'rm_bgm_g1', 'public', 'bgm#g1', 'retired', 'test'),
		       ('bgm', 2, 2, 'rm_bgm_g2', 'public', 'bgm#g2', 'live', 'test');
		INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner, stopped_reason, stopped_at) VALUES
			('bgm#g1', 0, 0, 1, 'inst-old', 'annals: generation 1 retired by the cut-over to generation 2', now()),
			('bgm#g2', 0, 0, 1, 'inst-live', NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	appendTicks(t, db, 3)

	c := consoleOn(t, db)
	row := c.row

	if r := row("/", "bgm#g1", "0"); !strings.Contains(r, " retired ") || !strings.Contains(r, " retired (generation 1 of bgm) ") {
		t.Errorf("overview bgm#g1/0: %q", r)
	}
	if r := row("/subscribers/bgm%23g1", "0"); !strings.HasPrefix(r, "0 retired ") || !strings.Contains(r, " retired (generation 1 of bgm) ") {
		t.Errorf("/subscribers/bgm#g1 partition 0: %q", r)
	}
	// The live generation is a partition like any other: nobody leads it
	// here, and the console says so.
	if r := row("/", "bgm#g2", "0"); !strings.Contains(r, " standing by ") || !strings.Contains(r, " none (last: inst-live) ") {
		t.Errorf("overview bgm#g2/0: %q", r)
	}

	// Readiness of the retired generation passes; of the live one, led by
	// nobody, it does not.
	health := func(subs map[string]int) (int, console.HealthReport) {
		t.Helper()
		rec := httptest.NewRecorder()
		console.Readiness(db.Pool, &console.HealthConfig{Schema: db.Schema, Subscribers: subs, MaxLagEvents: 1}).
			ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		var rep console.HealthReport
		if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		return rec.Code, rep
	}
	if code, rep := health(map[string]int{"bgm#g1": 1}); code != 200 || !rep.OK || len(rep.Partitions) != 1 ||
		!rep.Partitions[0].OK || !rep.Partitions[0].Retired || rep.Partitions[0].Problem != "" || rep.Partitions[0].LagEvents != 3 {
		t.Errorf("readiness of the retired generation: %d %+v", code, rep)
	}
	if code, rep := health(map[string]int{"bgm#g1": 1, "bgm#g2": 1}); code != 503 || len(rep.Partitions) != 2 ||
		!rep.Partitions[0].OK || rep.Partitions[1].OK || rep.Partitions[1].Retired || rep.Partitions[1].Problem != "no live leader" {
		t.Errorf("readiness of both generations: %d %+v", code, rep)
	}

	// /metrics: the retired generation's checkpoint and epoch, not whether
	// it is led, stopped or behind; the live one's all.
	_, body := c.get("/metrics")
	has := func(series string) bool {
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, series+" ") {
				return true
			}
		}
		return false
	}
	for _, name := range []string{"annals_subscriber_checkpoint_position", "annals_subscriber_epoch"} {
		if !has(name + `{partition="0",subscriber="bgm#g1"}`) {
			t.Errorf("/metrics lacks %s of bgm#g1/0", name)
		}
	}
	for _, name := range []string{"annals_subscriber_led", "annals_subscriber_stopped", "annals_subscriber_lag_events", "annals_subscriber_lag_seconds"} {
		if has(name + `{partition="0",subscriber="bgm#g1"}`) {
			t.Errorf("/metrics has %s of the retired bgm#g1/0", name)
		}
		if !has(name + `{partition="0",subscriber="bgm#g2"}`) {
			t.Errorf("/metrics lacks %s of bgm#g2/0", name)
		}
	}
}

// TestBuildingGeneration: a blue/green generation being built (bgm#g3,
// catching up from the log's start before its cut-over) is run like any
// subscriber, so its state, leader and series stay; the pages say which
// generation of which read model it is, as `annals status` does under its
// table, and /metrics has annals_read_model_generation for every
// generation, by state, so that an alert can leave a building one out of
// its lag rule. Before, nothing on the console told a building generation's
// growing lag from a broken subscriber's.
func TestBuildingGeneration(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO annals.read_model_generations (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by)
		VALUES ('bgm', 1, 1, 'rm_bgm_g1', 'public', 'bgm#g1', 'retired', 'test'),
		       ('bgm', 2, 2, 'rm_bgm_g2', 'public', 'bgm#g2', 'live', 'test'),
		       ('bgm', 3, 3, 'rm_bgm_g3', 'public', 'bgm#g3', 'building', 'test');
		INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner) VALUES
			('bgm#g1', 0, 0, 1, 'inst-old'),
			('bgm#g2', 0, 3, 1, 'inst-live'),
			('bgm#g3', 0, 0, 1, 'inst-live'),
			('plain', 0, 0, 1, 'inst-live')`); err != nil {
		t.Fatal(err)
	}
	appendTicks(t, db, 3)
	c := consoleOn(t, db)

	building := "generation 3 of bgm: being built; readers get it at the cut-over"
	for _, r := range []string{c.row("/", "bgm#g3", "0"), c.row("/subscribers/bgm%23g3", "0")} {
		if !strings.Contains(r, " standing by "+building+" ") {
			t.Errorf("bgm#g3/0: %q lacks %q after its state", r, building)
		}
	}
	if r := c.row("/", "bgm#g2", "0"); !strings.Contains(r, " standing by generation 2 of bgm: serves the readers ") {
		t.Errorf("bgm#g2/0: %q", r)
	}
	for _, sub := range []string{"bgm#g1", "plain"} {
		if r := c.row("/", sub, "0"); strings.Contains(r, "generation") && !strings.Contains(r, "retired (generation 1 of bgm)") {
			t.Errorf("%s/0: %q has a generation note", sub, r)
		}
	}

	_, body := c.get("/metrics")
	for _, want := range []string{
		`annals_read_model_generation{generation="1",read_model="bgm",state="retired",subscriber="bgm#g1"} 1`,
		`annals_read_model_generation{generation="2",read_model="bgm",state="live",subscriber="bgm#g2"} 1`,
		`annals_read_model_generation{generation="3",read_model="bgm",state="building",subscriber="bgm#g3"} 1`,
		// A building generation is judged like any subscriber.
		`annals_subscriber_lag_events{partition="0",subscriber="bgm#g3"} 3`,
	} {
		if !strings.Contains(body, "\n"+want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if n := strings.Count(body, "\nannals_read_model_generation{"); n != 3 {
		t.Errorf("/metrics has %d annals_read_model_generation series, want 3 (one per generation)", n)
	}
}

// appendTicks appends n events to stream s-1 of db.
func appendTicks(t *testing.T, db *annalstest.DB, n int) {
	t.Helper()
	store, err := eventstore.New(db.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]eventstore.EventData, n)
	for i := range evs {
		evs[i] = eventstore.EventData{Type: "ticked", Data: map[string]int{"n": i + 1}}
	}
	if _, err := store.Append(t.Context(), "s-1", eventstore.Any, evs...); err != nil {
		t.Fatal(err)
	}
}
