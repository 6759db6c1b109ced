package console_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/console"
)

// scrape reads /metrics and parses it with the Prometheus text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the value of the series of name whose labels include want
// (a gauge's or counter's value, a histogram's sample count), and whether
// there is one.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// TestMetrics parses /metrics with the Prometheus text parser and checks
// every documented series: those read from the database and the
// OpenTelemetry instruments of the event store and the runner (given the
// console's MeterProvider), before and after an operator's retry.
func TestMetrics(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	u := f.srv.URL + "/metrics"
	sub := map[string]string{"subscriber": "mailer", "partition": "0"}
	// The observer's checkpoint is flushed every second.
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		v, _ := value(scrape(t, u), "annals_subscriber_lag_events", sub)
		return v == 0
	})
	fams := scrape(t, u)
	for _, c := range []struct {
		name   string
		labels map[string]string
		check  func(float64) bool
		want   string
	}{
		{"annals_database_up", nil, eq(1), "1"},
		{"annals_database_scrape_duration_seconds", nil, gt(0), "> 0"},
		{"annals_head_position", nil, eq(12), "12"},
		{"annals_subscriber_checkpoint_position", sub, eq(12), "12"},
		{"annals_subscriber_lag_events", sub, eq(0), "0"},
		{"annals_subscriber_lag_seconds", sub, eq(0), "0"},
		{"annals_subscriber_epoch", sub, gt(0), "> 0"},
		{"annals_subscriber_led", sub, eq(1), "1"},
		{"annals_subscriber_stopped", sub, eq(0), "0"},
		{"annals_subscriber_kind", map[string]string{"subscriber": "mailer", "kind": "observer"}, eq(1), "1"},
		{"annals_dead_letters", map[string]string{"subscriber": "mailer", "status": "open"}, eq(1), "1"},
		{"annals_dead_letters", map[string]string{"subscriber": "mailer", "status": "resolved"}, eq(0), "0"},
		{"annals_instances", map[string]string{"state": "live"}, eq(1), "1"},
		{"annals_instances", map[string]string{"state": "stale"}, eq(0), "0"},
		{"annals_timers", map[string]string{"state": "pending"}, eq(1), "1"},
		{"annals_timers", map[string]string{"state": "failed"}, eq(0), "0"},
		// OpenTelemetry instruments, through the exporter.
		{"annals_append_events_total", nil, eq(12), "12"},
		{"annals_append_duration_seconds", nil, eq(6), "6 appends"},
		{"annals_handler_duration_seconds", map[string]string{"annals_subscriber": "mailer", "annals_outcome": "ok"}, eq(11), "11 calls"},
		{"annals_handler_duration_seconds", map[string]string{"annals_subscriber": "mailer", "annals_outcome": "error"}, eq(2), "2 calls (a retry)"},
		{"annals_batch_duration_seconds", map[string]string{"annals_subscriber": "mailer"}, gt(0), "> 0 batches"},
		{"annals_subscription_events_total", map[string]string{"annals_subscriber": "mailer"}, eq(12), "12"},
		{"annals_subscription_retries_total", map[string]string{"annals_subscriber": "mailer"}, eq(1), "1"},
		{"annals_subscription_dead_letters_total", map[string]string{"annals_subscriber": "mailer", "annals_reason": "failed"}, eq(1), "1"},
		{"annals_subscription_lag", map[string]string{"annals_subscriber": "mailer"}, eq(0), "0"},
		{"annals_subscription_lag_time_seconds", map[string]string{"annals_subscriber": "mailer"}, eq(0), "0"},
		{"annals_subscription_leader_ratio", map[string]string{"annals_subscriber": "mailer"}, eq(1), "1"},
		{"annals_listener_reconnects_total", nil, eq(0), "0"},
	} {
		v, ok := value(fams, c.name, c.labels)
		if !ok {
			t.Errorf("no series %s%v", c.name, c.labels)
			continue
		}
		if !c.check(v) {
			t.Errorf("%s%v = %v, want %s", c.name, c.labels, v, c.want)
		}
	}

	// Every annals series is documented, and every series the Grafana
	// dashboard charts exists.
	docs, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name := range fams {
		if strings.HasPrefix(name, "annals_") && !strings.Contains(string(docs), "`"+name+"`") {
			t.Errorf("series %s is not documented in docs/operations.md", name)
		}
	}
	dash, err := os.ReadFile(filepath.Join("..", "docs", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var parsed map[string]any
	if err := json.Unmarshal(dash, &parsed); err != nil {
		t.Fatalf("docs/grafana-dashboard.json: %v", err)
	}
	used := regexp.MustCompile(`annals_[a-z_]+`).FindAllString(string(dash), -1)
	if len(used) < 10 {
		t.Fatalf("the dashboard uses only %v", used)
	}
	// Series only a streaming standby makes (TestStandbysShown scrapes
	// them from a real replica); this fixture has none.
	standbyOnly := map[string]bool{"annals_standby_replay_lag_seconds": true, "annals_standby_replay_lag_bytes": true}
	for _, name := range used {
		base := strings.TrimSuffix(name, "_bucket")
		if _, ok := fams[base]; !ok && !standbyOnly[name] && name != "annals_subscriber" && name != "annals_outcome" && name != "annals_reason" {
			t.Errorf("the dashboard charts %s, which /metrics lacks", name)
		}
	}

	// An operator retries the dead letter; the runner re-delivers it.
	f.mailer.failing.Store(false)
	op := f.client(t)
	tok := op.login("ada")
	if code, body, _ := op.post("/dead-letters/retry", url.Values{"csrf": {tok}, "id": {strconv.FormatInt(f.dlID, 10)}}); code != http.StatusSeeOther {
		t.Fatalf("retry: %d %s", code, body)
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		fams := scrape(t, u)
		open, _ := value(fams, "annals_dead_letters", map[string]string{"subscriber": "mailer", "status": "open"})
		resolved, _ := value(fams, "annals_dead_letters", map[string]string{"subscriber": "mailer", "status": "resolved"})
		return open == 0 && resolved == 1
	})

	// With the database gone, the scrape still answers: annals_database_up 0.
	m, err := console.NewMetrics(f.db.Pool, &console.MetricsConfig{Schema: "no_such_schema"})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	m.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	p := expfmt.NewTextParser(model.UTF8Validation)
	bad, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := value(bad, "annals_database_up", nil); !ok || v != 0 {
		t.Errorf("annals_database_up on a missing schema = %v (%v), want 0", v, ok)
	}
	if _, ok := bad["annals_head_position"]; ok {
		t.Error("annals_head_position reported without a database")
	}
}

func eq(want float64) func(float64) bool { return func(v float64) bool { return v == want } }
func gt(min float64) func(float64) bool  { return func(v float64) bool { return v > min } }
