package console_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// dbSeries matches the series /metrics reads from the database at each
// scrape: every endpoint exports the same values, so a dashboard that sums
// them over its scrape targets shows N times the value with N targets.
var dbSeries = regexp.MustCompile(`annals_(?:database_[a-z_]+|head_position|subscriber_[a-z_]+|dead_letters|instances|timers|standbys|standby_[a-z_]+)\b`)

// acrossTargets matches what must come right before such a series in an
// expression: an aggregation that takes one target's value (max or min by
// the series' labels), optionally around a range function. Its labels start
// with job: with several jobs (databases) selected, same-named subscribers
// of two databases must not collapse into one series, nor the counts of
// two databases into the larger; sum across jobs after it.
var acrossTargets = regexp.MustCompile(`(?:max|min) by \(job(?:, [a-z_]+)*\) \((?:(?:changes|deriv)\()?$`)

var spaces = regexp.MustCompile(`\s+`)

// TestDashboardAggregatesDatabaseSeriesAcrossTargets checks that every
// expression of docs/grafana-dashboard.json over a database-read series
// first takes one value across the scrape targets.
func TestDashboardAggregatesDatabaseSeriesAcrossTargets(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join("..", "docs", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("docs/grafana-dashboard.json: %v", err)
	}
	checked := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, loc := range dbSeries.FindAllStringIndex(tg.Expr, -1) {
				checked++
				before := spaces.ReplaceAllString(tg.Expr[:loc[0]], " ")
				if !acrossTargets.MatchString(before) {
					t.Errorf("panel %q: %s is summed, used per target or merged across jobs; take max by (job, its labels) across targets first: %s",
						p.Title, tg.Expr[loc[0]:loc[1]], tg.Expr)
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d uses of database series found: is the dashboard's layout still panels[].targets[].expr?", checked)
	}
}
