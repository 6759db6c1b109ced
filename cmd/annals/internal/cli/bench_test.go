package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

func TestBenchRunnerQuick(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	jsonPath := filepath.Join(t.TempDir(), "runner.json")
	r := annals(t, db.URL, "bench", "--quick", "--only", "catchup,latency", "--latency-writers", "2", "--json", jsonPath)
	if r.code != 0 {
		t.Fatalf("bench: %+v", r)
	}
	for _, want := range []string{"catch-up throughput", "projection (no-op)", "end-to-end latency", "p50 annals/raw"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("bench output lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "append throughput") || strings.Contains(r.stdout, "takeover") {
		t.Fatalf("--only catchup,latency ran more:\n%s", r.stdout)
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Fsync   string            `json:"fsync"`
		Results []json.RawMessage `json:"results"`
		Catchup struct {
			Events          int     `json:"events"`
			Raw             float64 `json:"raw_read_events_per_sec"`
			RawCheckpoint   float64 `json:"raw_read_checkpoint_events_per_sec"`
			Projection      float64 `json:"projection_events_per_sec"`
			Observer        float64 `json:"observer_events_per_sec"`
			ProjectionVsRaw float64 `json:"projection_vs_raw"`
			ObserverVsRaw   float64 `json:"observer_vs_raw"`
		} `json:"catchup"`
		Latency struct {
			Writers int `json:"writers"`
			Results []struct {
				Rate   int `json:"target_events_per_sec"`
				Events int `json:"events"`
				Annals struct {
					Samples   int       `json:"samples"`
					P50       float64   `json:"p50_ms"`
					P99       float64   `json:"p99_ms"`
					Max       float64   `json:"max_ms"`
					Quantiles []float64 `json:"quantiles_ms"`
				} `json:"annals"`
				Raw struct {
					Samples int     `json:"samples"`
					P50     float64 `json:"p50_ms"`
					P99     float64 `json:"p99_ms"`
				} `json:"raw"`
				AnnalsAppend struct {
					Samples int     `json:"samples"`
					P50     float64 `json:"p50_ms"`
				} `json:"annals_append"`
				RawAppend struct {
					Samples int     `json:"samples"`
					P50     float64 `json:"p50_ms"`
				} `json:"raw_append"`
				P50VsRaw float64 `json:"p50_vs_raw"`
			} `json:"results"`
		} `json:"latency"`
		Takeover json.RawMessage `json:"takeover"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Fsync == "" || len(rep.Results) != 0 || rep.Takeover != nil {
		t.Fatalf("unexpected top level: %s", raw)
	}
	c := rep.Catchup
	if c.Events != 5000 || c.Raw <= 0 || c.RawCheckpoint <= 0 || c.Projection <= 0 || c.Observer <= 0 || c.ProjectionVsRaw <= 0 || c.ObserverVsRaw <= 0 {
		t.Fatalf("catch-up: %+v", c)
	}
	if len(rep.Latency.Results) != 1 || rep.Latency.Writers != 2 {
		t.Fatalf("latency: %s", raw)
	}
	l := rep.Latency.Results[0]
	if l.Rate != 100 || l.Events != 50 || l.Annals.Samples != 50 || l.Raw.Samples != 50 ||
		l.Annals.P50 <= 0 || l.Annals.P99 < l.Annals.P50 || l.Raw.P50 <= 0 || l.Raw.P99 < l.Raw.P50 || l.P50VsRaw <= 0 {
		t.Fatalf("latency: %+v", l)
	}
	// The appends' own durations: one per event.
	if l.AnnalsAppend.Samples != 50 || l.RawAppend.Samples != 50 || l.AnnalsAppend.P50 <= 0 || l.RawAppend.P50 <= 0 {
		t.Fatalf("latency, appends: %+v", l)
	}
	// The distribution: 101 non-decreasing quantiles, plotted next to the JSON.
	if q := l.Annals.Quantiles; len(q) != 101 || q[50] != l.Annals.P50 || q[100] != l.Annals.Max || !slices.IsSorted(q) {
		t.Fatalf("annals quantiles %v", q)
	}
	svg, err := os.ReadFile(strings.TrimSuffix(jsonPath, ".json") + "-latency.svg")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(svg), "<svg ") || strings.Count(string(svg), "<polyline") != 2 || !strings.Contains(string(svg), "raw PostgreSQL 100/s") {
		t.Fatalf("latency plot:\n%s", svg)
	}
}

func TestBenchTakeoverNeedsTheCLI(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	jsonPath := filepath.Join(t.TempDir(), "takeover.json")
	// Under go test the executable is the test binary: the benchmark says so
	// instead of re-executing it.
	r := annals(t, db.URL, "bench", "--quick", "--only", "takeover", "--json", jsonPath)
	if r.code != 0 || !strings.Contains(r.stdout, "takeover after SIGKILL: skipped") || !strings.Contains(r.stdout, "go run ./cmd/annals") {
		t.Fatalf("bench --only takeover: %+v", r)
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Takeover struct {
			Skipped string `json:"skipped"`
		} `json:"takeover"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil || rep.Takeover.Skipped == "" {
		t.Fatalf("takeover JSON (%v): %s", err, raw)
	}
	if r = annals(t, db.URL, "bench", "--only", "append,nope"); r.code != 2 {
		t.Fatalf("bench --only append,nope: %+v", r)
	}
}

// The takeover benchmark re-executes the annals binary: run it from one.
func TestBenchTakeoverBinary(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	dir := t.TempDir()
	bin := filepath.Join(dir, "annals")
	build := exec.Command("go", "build", "-o", bin, "github.com/annals-dev/annals/cmd/annals")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	jsonPath := filepath.Join(dir, "takeover.json")
	var stdout, stderr bytes.Buffer
	for run := range 2 { // the second run starts clean on the same database
		c := exec.Command(bin, "bench", "--quick", "--only", "takeover", "--json", jsonPath)
		c.Env = append(os.Environ(), "DATABASE_URL="+db.URL)
		stdout.Reset()
		stderr.Reset()
		c.Stdout, c.Stderr = &stdout, &stderr
		if err := c.Run(); err != nil {
			t.Fatalf("bench --only takeover, run %d: %v\nstdout:\n%s\nstderr:\n%s", run+1, err, stdout.String(), stderr.String())
		}
	}
	if !strings.Contains(stdout.String(), "runner standby") {
		t.Fatalf("takeover table:\n%s", stdout.String())
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Takeover struct {
			Skipped string `json:"skipped"`
			Raw     struct {
				Median float64 `json:"median_ms"`
			} `json:"raw"`
			Results []struct {
				LockRetry string    `json:"lock_retry_interval"`
				Graceful  bool      `json:"graceful"`
				Samples   []float64 `json:"samples_ms"`
				Median    float64   `json:"median_ms"`
				Max       float64   `json:"max_ms"`
			} `json:"results"`
		} `json:"takeover"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	tk := rep.Takeover
	// Quick: one SIGKILL and one graceful stop, at the default interval.
	if tk.Skipped != "" || tk.Raw.Median <= 0 || len(tk.Results) != 2 || !tk.Results[1].Graceful || tk.Results[0].Graceful {
		t.Fatalf("takeover: %s", raw)
	}
	for _, r := range tk.Results {
		if r.LockRetry != "20ms (default)" || len(r.Samples) != 1 || r.Median <= 0 || r.Max < r.Median {
			t.Fatalf("takeover: %s", raw)
		}
	}
}

// The rebuild benchmark runs end to end in quick mode and reports both
// contenders and their ratio.
func TestBenchRebuildQuick(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	jsonPath := filepath.Join(t.TempDir(), "rebuild.json")
	r := annals(t, db.URL, "bench", "--quick", "--only", "rebuild", "--json", jsonPath)
	if r.code != 0 {
		t.Fatalf("bench --only rebuild: %+v", r)
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Rebuild struct {
			Events       int     `json:"events"`
			Raw          float64 `json:"raw_events_per_sec"`
			Rebuild      float64 `json:"rebuild_events_per_sec"`
			RebuildVsRaw float64 `json:"rebuild_vs_raw"`
		} `json:"rebuild"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("rebuild JSON (%v): %s", err, raw)
	}
	rb := rep.Rebuild
	if rb.Events <= 0 || rb.Raw <= 0 || rb.Rebuild <= 0 || rb.RebuildVsRaw <= 0 {
		t.Fatalf("rebuild report has empty figures: %+v\n%s", rb, raw)
	}
	if strings.Contains(r.stdout, "append throughput") || strings.Contains(r.stdout, "end-to-end latency") {
		t.Fatalf("--only rebuild ran more:\n%s", r.stdout)
	}
}

// The append benchmark reports each contender's CPU time per event: the
// server's (the test clusters run on this machine, so it is measured) and
// this process's, with the ratios.
func TestBenchAppendCPU(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	jsonPath := filepath.Join(t.TempDir(), "append.json")
	r := annals(t, db.URL, "bench", "--quick", "--only", "append", "--writers", "2", "--batch", "3", "--json", jsonPath)
	if r.code != 0 || !strings.Contains(r.stdout, "CPU per event, µs (medians): PostgreSQL's processes + this process") {
		t.Fatalf("bench --only append: %+v", r)
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Note    string `json:"server_cpu_note"`
		Results []struct {
			Annals float64 `json:"annals_events_per_sec"`
			CPU    struct {
				RawServer    *float64 `json:"raw_server"`
				AnnalsServer *float64 `json:"annals_server"`
				RawClient    float64  `json:"raw_client"`
				AnnalsClient float64  `json:"annals_client"`
				VsRawServer  *float64 `json:"annals_vs_raw_server"`
				VsRawTotal   *float64 `json:"annals_vs_raw_total"`
			} `json:"cpu_us_per_event"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil || len(rep.Results) != 1 {
		t.Fatalf("append JSON (%v): %s", err, raw)
	}
	c := rep.Results[0].CPU
	if rep.Note != "" || c.RawServer == nil || c.AnnalsServer == nil || c.VsRawServer == nil || c.VsRawTotal == nil {
		t.Fatalf("the server's CPU time was not measured: %s", raw)
	}
	// An append costs the server at least a microsecond per event, and the
	// client something; the ratios are the figures'.
	if *c.RawServer < 1 || *c.AnnalsServer < 1 || c.RawClient <= 0 || c.AnnalsClient <= 0 {
		t.Fatalf("CPU per event: %s", raw)
	}
	if got, want := *c.VsRawServer, *c.AnnalsServer / *c.RawServer; got != want {
		t.Fatalf("annals_vs_raw_server %v, want %v", got, want)
	}
}

// The append benchmark measures each combination in interleaved rounds and
// reports the medians, with each round's rates and ratio: one run on a
// shared machine moves a lone measurement by a fifth.
func TestBenchAppendRounds(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	jsonPath := filepath.Join(t.TempDir(), "append.json")
	r := annals(t, db.URL, "bench", "--quick", "--only", "append", "--writers", "1", "--batch", "2",
		"--append-rounds", "3", "--duration", "100ms", "--json", jsonPath)
	if r.code != 0 || !strings.Contains(r.stdout, "medians of 3 interleaved round(s)") ||
		!strings.Contains(r.stdout, "annals/raw by round") || strings.Count(r.stderr, "append round ") != 3 {
		t.Fatalf("bench --append-rounds 3: %+v", r)
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Rounds  int `json:"append_rounds"`
		Results []struct {
			Raw    float64 `json:"raw_insert_events_per_sec"`
			Locked float64 `json:"raw_insert_locked_events_per_sec"`
			Annals float64 `json:"annals_events_per_sec"`
			VsRaw  float64 `json:"annals_vs_raw"`
			Rounds struct {
				Raw    []float64 `json:"raw_insert"`
				Locked []float64 `json:"raw_insert_locked"`
				Annals []float64 `json:"annals"`
				VsRaw  []float64 `json:"annals_vs_raw"`
			} `json:"rounds"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil || rep.Rounds != 3 || len(rep.Results) != 1 {
		t.Fatalf("append JSON (%v): %s", err, raw)
	}
	res := rep.Results[0]
	mid := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[1]
	}
	for name, c := range map[string]struct {
		rounds []float64
		median float64
	}{"raw": {res.Rounds.Raw, res.Raw}, "raw locked": {res.Rounds.Locked, res.Locked}, "annals": {res.Rounds.Annals, res.Annals}} {
		if len(c.rounds) != 3 || slices.Min(c.rounds) <= 0 || mid(c.rounds) != c.median {
			t.Fatalf("%s: rounds %v, median %v: %s", name, c.rounds, c.median, raw)
		}
	}
	if len(res.Rounds.VsRaw) != 3 || res.VsRaw != res.Annals/res.Raw {
		t.Fatalf("ratios: %s", raw)
	}
	for i, x := range res.Rounds.VsRaw {
		if x != res.Rounds.Annals[i]/res.Rounds.Raw[i] {
			t.Fatalf("round %d's ratio %v: %s", i+1, x, raw)
		}
	}
	if r := annals(t, db.URL, "bench", "--only", "append", "--append-rounds", "0"); r.code != 2 || !strings.Contains(r.stderr, "--append-rounds 0: want 1..100") {
		t.Fatalf("--append-rounds 0: %+v", r)
	}
}

// Every benchmark the test binary can run starts clean on a database it ran
// on before (the takeover benchmark, which needs the CLI binary, is run
// twice by TestBenchTakeoverBinary).
func TestBenchTwice(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for run := range 2 {
		r := annals(t, db.URL, "bench", "--quick", "--only", "append,catchup,latency,rebuild",
			"--writers", "1", "--batch", "2", "--events", "200", "--rebuild-events", "200")
		if r.code != 0 || !strings.Contains(r.stdout, "annals/raw") {
			t.Fatalf("run %d: %+v", run+1, r)
		}
	}
}

// bench --output json prints the --json document on stdout instead of the
// tables (progress stays on stderr); bench printed only tables before,
// its JSON only to a file.
func TestBenchOutputJSON(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	r := annals(t, db.URL, "bench", "--quick", "--only", "catchup", "--output", "json")
	var doc struct {
		Fsync   string `json:"fsync"`
		Catchup *struct {
			Events int `json:"events"`
		} `json:"catchup"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &doc) != nil || doc.Catchup == nil || doc.Catchup.Events == 0 || doc.Fsync == "" {
		t.Fatalf("bench --output json: %+v", r)
	}
	if strings.Contains(r.stdout, "catch-up throughput") {
		t.Fatalf("bench --output json printed a table:\n%s", r.stdout)
	}
}
