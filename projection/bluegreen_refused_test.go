package projection_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// TestLiveGenerationRunsBesideRefusedGenerations: another runner role
// planted building rows at the live version of this service's read model,
// one forged (a schema annals does not give the generation), one squatted
// (the right name, the schema made by that role). The runner refused the
// first such row it met and stopped there: at start-up Run failed, and in
// its rounds, which went through the generations in map order, the live
// generation was started or not by chance. A refused row is skipped, with
// a warning at most once a minute naming it, why, and who may write the
// rows; the live generation runs, and the refused ones never do.
func TestLiveGenerationRunsBesideRefusedGenerations(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	victim, sq := squatterPool(t, db), squatterPool(t, db)
	var role, forger string
	if err := victim.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	if err := sq.QueryRow(ctx, `SELECT current_user`).Scan(&forger); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA reads AUTHORIZATION `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA reads CASCADE`) })
	logs := &annalstest.LogBuffer{}
	runner := func(id string) *projection.Runner {
		r, err := projection.NewRunner(victim, &projection.Config{
			InstanceID: id, Schema: db.Schema, PollInterval: 50 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
			ShutdownTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(statsProjection(1), &projection.Options{BlueGreen: &projection.BlueGreen{
			Version: 1, ReaderSchema: "reads", CheckInterval: 20 * time.Millisecond}}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	log := &bgLog{db: db}
	if err := log.add(ctx, 2, 2); err != nil {
		t.Fatal(err)
	}
	if err := runner("setup").RunUntilCaughtUp(ctx); err != nil {
		t.Fatalf("version 1 as a runner role: %v", err)
	}
	plant := func(stmts ...string) {
		t.Helper()
		for _, s := range stmts {
			if _, err := sq.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
	}
	gensTable := pgx.Identifier{db.Schema}.Sanitize() + `.read_model_generations`
	// Forged: building at the live version, naming a schema that is not
	// generation 2's.
	plant(`INSERT INTO ` + gensTable + ` (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by)
		 VALUES ('bgstats', 2, 1, 'rm_bgstats_g9', 'reads', 'bgstats#g2', 'building', 'v1')`)
	// RunUntilCaughtUp catches the live generation up beside it.
	if err := log.add(ctx, 1, 2); err != nil {
		t.Fatal(err)
	}
	if err := runner("catch-up").RunUntilCaughtUp(ctx); err != nil {
		t.Fatalf("RunUntilCaughtUp beside a forged building generation: %v", err)
	}
	sees := func(streams int) func() bool {
		return func() bool {
			m, err := readStats(ctx, victim, "reads.stats")
			return err == nil && len(m) == streams && m[streamName(streams-1)].n == 2
		}
	}
	if !sees(3)() {
		t.Fatal("RunUntilCaughtUp did not catch the live generation up")
	}
	bgRunInBackground(t, runner("v1"))
	streams := 3
	for i := range 6 {
		if i == 2 {
			// Squatted, planted while the runner runs: the right name, the
			// schema the other role's.
			plant(`INSERT INTO `+gensTable+` (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by)
				 VALUES ('bgstats', 3, 1, 'rm_bgstats_g3', 'reads', 'bgstats#g3', 'building', 'v1')`,
				`CREATE SCHEMA rm_bgstats_g3`,
				`CREATE TABLE rm_bgstats_g3.stats (stream text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)`,
				`GRANT USAGE ON SCHEMA rm_bgstats_g3 TO PUBLIC`,
				`GRANT ALL ON rm_bgstats_g3.stats TO PUBLIC`)
			// A round has seen it.
			annalstest.WaitFor(t, 10*time.Second, func() bool { return refusedIn(logs.String(), 3) > 0 })
		}
		if err := log.add(ctx, 1, 2); err != nil {
			t.Fatal(err)
		}
		streams++
		annalstest.WaitFor(t, 10*time.Second, sees(streams))
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{db.Schema}.Sanitize()+
		`.checkpoints WHERE subscriber_id IN ('bgstats#g2', 'bgstats#g3')`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d checkpoints of the refused generations (%v); want none: they never ran", n, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM rm_bgstats_g3.stats`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the squatter's rm_bgstats_g3.stats has %d rows (%v); want none written", n, err)
	}
	for _, g := range []projection.GenerationState{state(t, db, 2), state(t, db, 3)} {
		if g != projection.GenerationBuilding {
			t.Errorf("a refused generation is %s; want it left as its row says (building)", g)
		}
	}
	if s := state(t, db, 1); s != projection.GenerationLive {
		t.Errorf("generation 1 is %s, want live", s)
	}
	// Each refused row is named, with why and who may write the rows: once
	// by RunUntilCaughtUp (generation 2), once by the rounds of Run for
	// each (at most once a minute), not every round.
	out := logs.String()
	for gen, want := range map[int]int{2: 2, 3: 1} {
		lines := refusedLines(out, gen)
		if len(lines) != want {
			t.Errorf("generation %d refused %d times in the log, want %d:\n%s", gen, len(lines), want, out)
			continue
		}
		for _, l := range lines {
			if !strings.Contains(l, forger) || !strings.Contains(l, "why=") {
				t.Errorf("the warning does not name why and the other runner role %s: %s", forger, l)
			}
		}
	}
}

// refusedLines returns the lines of out that warn that generation gen is
// refused and skipped.
func refusedLines(out string, gen int) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "is refused and skipped") && strings.Contains(l, fmt.Sprintf(" generation=%d ", gen)) {
			lines = append(lines, l)
		}
	}
	return lines
}

func refusedIn(out string, gen int) int { return len(refusedLines(out, gen)) }
