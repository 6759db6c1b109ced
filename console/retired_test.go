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
	store, err := eventstore.New(db.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "s-1", eventstore.NoStream, eventstore.EventData{Type: "ticked", Data: map[string]int{"n": 1}},
		eventstore.EventData{Type: "ticked", Data: map[string]int{"n": 2}}, eventstore.EventData{Type: "ticked", Data: map[string]int{"n": 3}}); err != nil {
		t.Fatal(err)
	}

	con, err := console.New(db.Pool, &console.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	c := &client{t: t, base: srv.URL, hc: srv.Client()}
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
