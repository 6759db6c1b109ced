package projectioncmd

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// perStream counts events per stream in table counts, times its version.
type perStream struct{ version int }

func (p perStream) Name() string { return "counts" }
func (p perStream) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO counts VALUES ($1, $2) ON CONFLICT (stream) DO UPDATE SET n = counts.n + $2`, e.StreamID, p.version)
	return err
}
func (p perStream) SetupVersion() int { return 1 }
func (p perStream) Setup(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `CREATE TABLE counts (stream text PRIMARY KEY, n int NOT NULL)`)
	return err
}

func blueGreenBundle(t *testing.T, b *bundle, version int) *bundle {
	t.Helper()
	r, err := projection.NewRunner(b.db.Pool, &projection.Config{InstanceID: "bg-" + string(rune('0'+version))})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(perStream{version}, &projection.Options{BlueGreen: &projection.BlueGreen{Version: version}}); err != nil {
		t.Fatal(err)
	}
	return &bundle{db: b.db, store: b.store, runner: r}
}

func TestBlueGreenCommands(t *testing.T) {
	b := setup(t)
	v1 := blueGreenBundle(t, b, 1)
	b.fill(t, 300)
	if err := v1.runner.RunUntilCaughtUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	sum := func() (n int) {
		t.Helper()
		if err := b.db.Pool.QueryRow(t.Context(), `SELECT coalesce(sum(n), 0) FROM public.counts`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := sum(); got != 300 {
		t.Fatalf("version 1 counts %d, want 300", got)
	}

	v2 := blueGreenBundle(t, b, 2)
	res := v2.execute(t, false, "", "rebuild", "counts", "--yes")
	var err error
	if res.err != nil {
		t.Fatalf("rebuild: %v\n%s", res.err, res.stderr)
	}
	if !strings.Contains(res.stdout, "cut over from generation 1 to 2") {
		t.Fatalf("rebuild printed %q", res.stdout)
	}
	if got := sum(); got != 600 {
		t.Fatalf("after the cut-over the view counts %d, want 600 (version 2)", got)
	}

	// list and status show the registered name (what rebuild takes), the
	// kind blue/green and the live generation in a column of its own.
	res = v2.execute(t, false, "", "status", "counts")
	if res.err != nil || strings.Join(fields(lineOf(t, res.stdout, "counts"))[:5], " ") != "counts projection (blue/green) 2 (live)" ||
		strings.Contains(res.stdout, "#g") || !strings.Contains(res.stdout, "GENERATION") {
		t.Fatalf("status of a blue/green projection shows its live generation: %v\n%s", res.err, res.stdout)
	}
	res = v2.execute(t, false, "", "list")
	if res.err != nil || strings.Join(fields(lineOf(t, res.stdout, "counts"))[:6], " ") != "counts projection (blue/green) 2 (live) 1" ||
		strings.Contains(res.stdout, "#g") {
		t.Fatalf("list of a blue/green projection: %v\n%s", res.err, res.stdout)
	}
	for _, args := range [][]string{{"list", "-o", "json"}, {"status", "counts", "-o", "json"}} {
		res = v2.execute(t, false, "", args...)
		var entries []map[string]any
		if args[0] == "list" {
			err = json.Unmarshal([]byte(res.stdout), &entries)
		} else {
			var st struct {
				Partitions []map[string]any `json:"partitions"`
			}
			err = json.Unmarshal([]byte(res.stdout), &st)
			entries = st.Partitions
		}
		if res.err != nil || err != nil || len(entries) != 1 {
			t.Fatalf("%v: %v %v in %s", args, res.err, err, res.stdout)
		}
		if e := entries[0]; e["name"] != "counts" || e["kind"] != "projection (blue/green)" || e["subscriber"] != "counts#g2" ||
			e["generation"] != float64(2) || e["generation_state"] != "live" {
			t.Fatalf("%v: %v", args, e)
		}
	}
	res = v2.execute(t, false, "", "generations", "counts", "--output", "json")
	if res.err != nil {
		t.Fatal(res.err)
	}
	var gens []projection.Generation
	if err := json.Unmarshal([]byte(res.stdout), &gens); err != nil {
		t.Fatalf("%v in %q", err, res.stdout)
	}
	if len(gens) != 2 || gens[0].State != projection.GenerationRetired || gens[1].State != projection.GenerationLive || gens[1].CutoverMS == nil ||
		gens[1].Replaced == nil || *gens[1].Replaced != 1 {
		t.Fatalf("generations: %+v", gens)
	}
	res = v2.execute(t, false, "", "generations", "counts")
	if res.err != nil || !strings.Contains(lineOf(t, res.stdout, "2 "), "live") {
		t.Fatalf("generations (text): %v\n%s", res.err, res.stdout)
	}
	// The text table shows what the live generation replaced, in the column
	// under REPLACED (tabwriter aligns the columns' starts).
	if col := strings.Index(lineOf(t, res.stdout, "GENERATION"), "REPLACED"); col < 0 ||
		!strings.HasPrefix(lineOf(t, res.stdout, "2 ")[col:], "1 ") || !strings.HasPrefix(lineOf(t, res.stdout, "1 ")[col:], "- ") {
		t.Fatalf("generations (text): no REPLACED column reading 1 for generation 2 and - for 1:\n%s", res.stdout)
	}
	if res = v2.execute(t, false, "", "generations", "counts", "--output", "yaml"); !errors.Is(res.err, ErrUsage) {
		t.Fatalf("--output yaml: %v", res.err)
	}

	if res = v2.execute(t, false, "", "rollback", "counts"); !errors.Is(res.err, ErrUsage) || !errors.Is(res.err, ErrNotConfirmed) {
		t.Fatalf("rollback without --yes and without a terminal: %v", res.err)
	}
	// --from names the generation to roll back from: another one live is
	// a usage error that changes nothing (a retried rollback that landed).
	if res = v2.execute(t, false, "", "rollback", "counts", "--from", "1", "--yes"); !errors.Is(res.err, ErrUsage) || !errors.Is(res.err, projection.ErrNotLive) {
		t.Fatalf("rollback --from 1 while generation 2 is live: %v", res.err)
	}
	if res = v2.execute(t, false, "", "rollback", "counts", "--from", "-2", "--yes"); !errors.Is(res.err, ErrUsage) {
		t.Fatalf("rollback --from -2: %v", res.err)
	}
	res = v2.execute(t, false, "", "rollback", "counts", "--from", "2", "--yes")
	if res.err != nil || !strings.Contains(res.stdout, "back from generation 2") {
		t.Fatalf("rollback: %v\n%s", res.err, res.stdout)
	}
	if res = v2.execute(t, false, "", "rollback", "counts", "--from", "2", "--yes"); !errors.Is(res.err, ErrUsage) || !errors.Is(res.err, projection.ErrNotLive) {
		t.Fatalf("retried rollback --from 2: %v", res.err)
	}
	if got := sum(); got != 300 {
		t.Fatalf("after the rollback the view counts %d, want 300 (version 1)", got)
	}
	// Generation 1 keeps the time it first went live, before generation 2,
	// and shows the rollback's under LIVE AGAIN (the rollback overwrote
	// LIVE SINCE).
	res = v2.execute(t, false, "", "generations", "counts", "--output", "json")
	gens = nil
	if err := json.Unmarshal([]byte(res.stdout), &gens); res.err != nil || err != nil || len(gens) != 2 {
		t.Fatalf("generations after the rollback: %v %v in %q", res.err, err, res.stdout)
	}
	if g1, g2 := gens[0], gens[1]; g1.LiveSince == nil || g2.LiveSince == nil || !g1.LiveSince.Before(*g2.LiveSince) ||
		g1.LiveAgain == nil || !g1.LiveAgain.After(*g2.LiveSince) || g2.LiveAgain != nil {
		t.Fatalf("generations after the rollback: %+v", gens)
	}
	res = v2.execute(t, false, "", "generations", "counts")
	header := lineOf(t, res.stdout, "GENERATION")
	since, again := strings.Index(header, "LIVE SINCE"), strings.Index(header, "LIVE AGAIN")
	l1, l2 := lineOf(t, res.stdout, "1 "), lineOf(t, res.stdout, "2 ")
	if since < 0 || again < 0 || !strings.HasPrefix(l1[since:], gens[0].LiveSince.UTC().Format(time.RFC3339)) ||
		!strings.HasPrefix(l1[again:], gens[0].LiveAgain.UTC().Format(time.RFC3339)) || !strings.HasPrefix(l2[again:], "- ") {
		t.Fatalf("generations (text) after the rollback: want generation 1's first time under LIVE SINCE, the rollback's under LIVE AGAIN:\n%s", res.stdout)
	}
	if res = v2.execute(t, false, "", "rollback", "counts", "--yes"); !errors.Is(res.err, ErrUsage) || !errors.Is(res.err, projection.ErrNoRollback) {
		t.Fatalf("second rollback: %v", res.err)
	}
}
