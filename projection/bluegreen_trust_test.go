package projection_test

import (
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// statsReads returns the generation schema public.stats reads.
func statsReads(t *testing.T, db *annalstest.DB) string {
	t.Helper()
	var def string
	if err := db.Pool.QueryRow(t.Context(), `SELECT pg_get_viewdef('public.stats'::regclass)`).Scan(&def); err != nil {
		t.Fatalf("public.stats: %v", err)
	}
	for _, s := range []string{"rm_bgstats_g1", "rm_bgstats_g2", "rm_bgstats_g3"} {
		if strings.Contains(def, s+".") {
			return s
		}
	}
	return def
}

// TestDropRetiredRefusesALiveGenerationMarkedRetired: the row names the
// schema annals gives the generation (226377b's check passes), but another
// runner role marked the live generation retired a month ago, and the
// janitor (DropRetired, a runner's round after BlueGreen.Retention) dropped
// its schema CASCADE, the reader schema's views with it. DropRetired
// refuses a schema that objects of other schemas depend on
// (ErrGenerationInUse), and drops nothing of it.
func TestDropRetiredRefusesALiveGenerationMarkedRetired(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	seedV1(t, db, &bgLog{db: db}, 3, 2)
	if cut, err := bgRunner(t, db, "v2", 2, false).RebuildBlueGreen(ctx, bgName, nil); err != nil || cut.To != 2 {
		t.Fatalf("cut-over to g2: %+v %v", cut, err)
	}
	if _, err := runnerRolePool(t, db).Exec(ctx, `UPDATE `+pgx.Identifier{db.Schema}.Sanitize()+`.read_model_generations
		SET state = 'retired', retired_at = now() - interval '30 days' WHERE projection = 'bgstats' AND generation = 2`); err != nil {
		t.Fatal(err)
	}
	dropped, err := projection.DropRetired(ctx, db.Pool, db.Schema, bgName, 0)
	if !errors.Is(err, projection.ErrGenerationInUse) || !strings.Contains(err.Error(), "rm_bgstats_g2") {
		t.Errorf("DropRetired: %v, %v; want ErrGenerationInUse naming rm_bgstats_g2", dropped, err)
	}
	if len(dropped) != 1 || dropped[0] != 1 {
		t.Errorf("dropped %v, want [1] (generation 1, retired by the cut-over)", dropped)
	}
	if s := statsReads(t, db); s != "rm_bgstats_g2" {
		t.Errorf("public.stats reads %s, want rm_bgstats_g2", s)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM public.stats`).Scan(&n); err != nil || n != 3 {
		t.Errorf("public.stats: %d rows, %v; want 3", n, err)
	}
	if s := state(t, db, 2); s != projection.GenerationRetired {
		t.Errorf("generation 2 is %s; want it left as the row says (retired)", s)
	}
}
