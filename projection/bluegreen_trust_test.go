package projection_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// squatterPool is runnerRolePool with CREATE on the database, as a
// runner role of blue/green read models needs (read_model_create_schema
// makes a generation's schema with the caller's rights).
func squatterPool(t *testing.T, db *annalstest.DB) *pgxpool.Pool {
	t.Helper()
	pool := runnerRolePool(t, db)
	var role string
	if err := pool.QueryRow(t.Context(), `SELECT current_user`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(t.Context(), "GRANT CREATE ON DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" TO "+
		pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return pool
}

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

// TestRunnerRefusesASquattedGenerationSchema: another runner role
// registered a building generation of this service's read model at its new
// version, naming the schema annals gives it (rm_bgstats_g2, so the row
// is not forged by f9aa5cf's measure), and made that schema itself, with
// the table, first. The runner of the new version adopted the row, its
// handlers wrote into the squatter's table and its cut-over pointed the
// readers at it: the squatter owns it, and may read and change it all. The
// runner refuses a generation schema another role owns
// (ErrForeignGenerationSchema): nothing is written there, readers stay.
func TestRunnerRefusesASquattedGenerationSchema(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	seedV1(t, db, &bgLog{db: db}, 3, 2)
	sq := squatterPool(t, db)
	for _, s := range []string{
		`INSERT INTO ` + pgx.Identifier{db.Schema}.Sanitize() + `.read_model_generations
		     (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by)
		 VALUES ('bgstats', 2, 2, 'rm_bgstats_g2', 'public', 'bgstats#g2', 'building', 'v2')`,
		`CREATE SCHEMA rm_bgstats_g2`,
		`CREATE TABLE rm_bgstats_g2.stats (stream text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)`,
		`GRANT USAGE ON SCHEMA rm_bgstats_g2 TO PUBLIC`,
		`GRANT ALL ON rm_bgstats_g2.stats TO PUBLIC`,
	} {
		if _, err := sq.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	err := bgRunner(t, db, "v2", 2, false).RunUntilCaughtUp(ctx)
	if !errors.Is(err, projection.ErrForeignGenerationSchema) || !strings.Contains(err.Error(), "annals_forger_") {
		t.Errorf("RunUntilCaughtUp: %v; want ErrForeignGenerationSchema naming the squatter", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM rm_bgstats_g2.stats`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the squatter's rm_bgstats_g2.stats has %d rows (%v); want none written", n, err)
	}
	if s := statsReads(t, db); s != "rm_bgstats_g1" {
		t.Errorf("public.stats reads %s, want rm_bgstats_g1", s)
	}
	if s := state(t, db, 1); s != projection.GenerationLive {
		t.Errorf("generation 1 is %s, want live", s)
	}
}

// TestRollbackRefusesASquattedGenerationSchema: generation 1 was retired
// by the cut-over to 2 and dropped by the janitor; another runner role
// made its schema name again (rm_bgstats_g1, with a stats table of its
// own) and set the row back to retired. A rollback (the reader schema holds
// views of generation 2, as ReaderViews wants) pointed the readers' views
// at the squatter's table. It refuses (ErrForeignGenerationSchema) and
// changes nothing.
func TestRollbackRefusesASquattedGenerationSchema(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	seedV1(t, db, &bgLog{db: db}, 3, 2)
	if cut, err := bgRunner(t, db, "v2", 2, false).RebuildBlueGreen(ctx, bgName, nil); err != nil || cut.To != 2 {
		t.Fatalf("cut-over to g2: %+v %v", cut, err)
	}
	if dropped, err := projection.DropRetired(ctx, db.Pool, db.Schema, bgName, 0); err != nil || len(dropped) != 1 {
		t.Fatalf("DropRetired: %v, %v", dropped, err)
	}
	sq := squatterPool(t, db)
	for _, s := range []string{
		`CREATE SCHEMA rm_bgstats_g1`,
		`CREATE TABLE rm_bgstats_g1.stats (stream text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)`,
		`INSERT INTO rm_bgstats_g1.stats VALUES ('planted', 1, 1)`,
		`GRANT USAGE ON SCHEMA rm_bgstats_g1 TO PUBLIC`,
		`GRANT ALL ON rm_bgstats_g1.stats TO PUBLIC`,
		`UPDATE ` + pgx.Identifier{db.Schema}.Sanitize() + `.read_model_generations
		    SET state = 'retired', dropped_at = NULL WHERE projection = 'bgstats' AND generation = 1`,
	} {
		if _, err := sq.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	rb, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName)
	if !errors.Is(err, projection.ErrForeignGenerationSchema) {
		t.Errorf("Rollback: %+v, %v; want ErrForeignGenerationSchema", rb, err)
	}
	if s := statsReads(t, db); s != "rm_bgstats_g2" {
		t.Errorf("public.stats reads %s, want rm_bgstats_g2", s)
	}
	if s := state(t, db, 2); s != projection.GenerationLive {
		t.Errorf("generation 2 is %s, want live", s)
	}
}

// TestBlueGreenOfTwoRunnerRoles: as TestRunnerRefusesASquattedGenerationSchema
// with the victim a runner role too (annals grant runner, CREATE on the
// database, a reader schema of its own), not a superuser: its own
// generation schemas pass the owner check (it builds version 2 and cuts
// over), and version 3's, made first by the other runner role, does not.
func TestBlueGreenOfTwoRunnerRoles(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	victim, sq := squatterPool(t, db), squatterPool(t, db)
	var role string
	if err := victim.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA reads AUTHORIZATION `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA reads CASCADE`) })
	runner := func(version int) *projection.Runner {
		r, err := projection.NewRunner(victim, &projection.Config{InstanceID: fmt.Sprintf("v%d", version), Schema: db.Schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(statsProjection(version), &projection.Options{BlueGreen: &projection.BlueGreen{
			Version: version, ReaderSchema: "reads"}}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	log := &bgLog{db: db}
	if err := log.add(ctx, 3, 2); err != nil {
		t.Fatal(err)
	}
	if err := runner(1).RunUntilCaughtUp(ctx); err != nil {
		t.Fatalf("version 1 as a runner role: %v", err)
	}
	if cut, err := runner(2).RebuildBlueGreen(ctx, bgName, nil); err != nil || cut.To != 2 {
		t.Fatalf("version 2 as a runner role: %+v, %v", cut, err)
	}
	for _, s := range []string{
		`INSERT INTO ` + pgx.Identifier{db.Schema}.Sanitize() + `.read_model_generations
		     (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by)
		 VALUES ('bgstats', 3, 3, 'rm_bgstats_g3', 'reads', 'bgstats#g3', 'building', 'v3')`,
		`CREATE SCHEMA rm_bgstats_g3`,
		`CREATE TABLE rm_bgstats_g3.stats (stream text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)`,
		`GRANT USAGE ON SCHEMA rm_bgstats_g3 TO PUBLIC`,
		`GRANT ALL ON rm_bgstats_g3.stats TO PUBLIC`,
	} {
		if _, err := sq.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if err := runner(3).RunUntilCaughtUp(ctx); !errors.Is(err, projection.ErrForeignGenerationSchema) {
		t.Errorf("version 3: %v; want ErrForeignGenerationSchema", err)
	}
	var def string
	if err := db.Pool.QueryRow(ctx, `SELECT pg_get_viewdef('reads.stats'::regclass)`).Scan(&def); err != nil || !strings.Contains(def, "rm_bgstats_g2.") {
		t.Errorf("reads.stats is %q (%v); want the view over generation 2", def, err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM rm_bgstats_g3.stats`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the squatter's rm_bgstats_g3.stats has %d rows (%v); want none written", n, err)
	}
}
