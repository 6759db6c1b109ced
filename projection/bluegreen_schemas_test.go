package projection_test

import (
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
)

// bgSide is one annals schema of a database with a blue/green projection
// bgName whose views are in reader schema reader.
type bgSide struct {
	db     *annalstest.DB // Schema: this side's annals schema
	reader string
	log    *bgLog
}

// secondSchema migrates annals schema schema into db's database and
// returns a DB of it (the same pool).
func secondSchema(t *testing.T, db *annalstest.DB, schema string) *annalstest.DB {
	t.Helper()
	if _, err := migrations.Up(t.Context(), db.Pool, &migrations.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	return &annalstest.DB{URL: db.URL, Name: db.Name, Schema: schema, Pool: db.Pool}
}

func newBGSide(t *testing.T, db *annalstest.DB, reader string) *bgSide {
	t.Helper()
	if _, err := db.Pool.Exec(t.Context(), `CREATE SCHEMA `+pgx.Identifier{reader}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return &bgSide{db: db, reader: reader, log: &bgLog{db: db}}
}

// runner returns a runner of version version of the side's projection, in
// its annals schema.
func (s *bgSide) runner(t *testing.T, id string, version int) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(s.db.Pool, &projection.Config{
		Schema: s.db.Schema, InstanceID: id, PollInterval: 100 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(statsProjection(version), &projection.Options{BlueGreen: &projection.BlueGreen{
		Version: version, ReaderSchema: s.reader, CheckInterval: 100 * time.Millisecond,
	}}); err != nil {
		t.Fatal(err)
	}
	return r
}

// sees returns nil when the side's readers see the whole log as version
// version wrote it.
func (s *bgSide) sees(t *testing.T, version int) error {
	m, err := readStats(t.Context(), s.db.Pool, pgx.Identifier{s.reader, "stats"}.Sanitize())
	if err != nil {
		return err
	}
	lens := s.log.lengths()
	v, events, err := verdict(m, lens)
	if err != nil {
		return err
	}
	var all int64
	for _, l := range lens {
		all += int64(l)
	}
	if v != version || events != all {
		return errors.Newf("%s: readers see version %d with %d events, want version %d with %d", s.db.Schema, v, events, version, all)
	}
	return nil
}

// generations returns the side's generations.
func (s *bgSide) generations(t *testing.T) []projection.Generation {
	t.Helper()
	gens, err := projection.ListGenerations(t.Context(), s.db.Pool, s.db.Schema, bgName)
	if err != nil {
		t.Fatal(err)
	}
	return gens
}

func schemaExists(t *testing.T, db *annalstest.DB, schema string) bool {
	t.Helper()
	var ok bool
	if err := db.Pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// scopedName is the schema annals gives generation gen of bgName in annals
// schema schema other than the default: rm_bgstats_g<gen>_<8 hex of
// md5(schema)>.
func scopedName(schema string, gen int) string {
	h := md5.Sum([]byte(schema))
	return fmt.Sprintf("rm_%s_g%d_%s", bgName, gen, hex.EncodeToString(h[:4]))
}

// TestBlueGreenTwoAnnalsSchemas: two annals schemas of one database (a
// service or a tenant per schema) each run a blue/green projection of the
// same name, each with its own reader schema. Annals named a generation's
// schema after the projection alone (rm_<name>_g<N>), so the second
// schema's first generation failed every check with 42P06 (schema
// rm_bgstats_g1 already exists). Each now builds, cuts over, rolls back
// and drops its own generations, and the other's readers and schemas are
// untouched at every step; in the default schema the names are what they
// were.
func TestBlueGreenTwoAnnalsSchemas(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{"annals", "tenant_b"},
		{"tenant_a", `Tenant "B"`},
	} {
		t.Run(c.a+"+"+c.b, func(t *testing.T) {
			db := annalstest.NewDB(t, &annalstest.Options{Schema: c.a})
			ctx := t.Context()
			sides := []*bgSide{newBGSide(t, db, "reads_a"), newBGSide(t, secondSchema(t, db, c.b), "reads_b")}
			want := map[*bgSide]int{} // the version each side's readers see
			check := func(step string) {
				t.Helper()
				for _, s := range sides {
					annalstest.WaitForErr(t, 30*time.Second, func() error {
						return errors.Wrap(s.sees(t, want[s]), step)
					})
				}
			}
			for i, s := range sides {
				if err := s.log.add(ctx, 5+i, 4); err != nil {
					t.Fatal(err)
				}
				bgRunInBackground(t, s.runner(t, fmt.Sprintf("%s-v1", s.db.Schema), 1))
				want[s] = 1
			}
			check("first generations")
			names := map[string]string{}
			for _, s := range sides {
				g := s.generations(t)[0]
				wantName := scopedName(s.db.Schema, 1)
				if s.db.Schema == "annals" {
					wantName = "rm_bgstats_g1"
				}
				if g.Schema != wantName {
					t.Errorf("%s: generation 1's schema is %q, want %q", s.db.Schema, g.Schema, wantName)
				}
				if other, ok := names[g.Schema]; ok {
					t.Fatalf("%s and %s share schema %s", other, s.db.Schema, g.Schema)
				}
				names[g.Schema] = s.db.Schema
			}
			for _, s := range sides {
				c, err := s.runner(t, s.db.Schema+"-v2", 2).RebuildBlueGreen(ctx, bgName, nil)
				if err != nil || c.From != 1 || c.To != 2 {
					t.Fatalf("%s: cut-over to g2: %+v %v", s.db.Schema, c, err)
				}
				want[s] = 2
				check(s.db.Schema + " cut over")
			}
			for _, s := range sides {
				rb, err := projection.Rollback(ctx, s.db.Pool, s.db.Schema, bgName)
				if err != nil || rb.From != 2 || rb.To != 1 {
					t.Fatalf("%s: rollback to g1: %+v %v", s.db.Schema, rb, err)
				}
				want[s] = 1
				check(s.db.Schema + " rolled back")
			}
			for i, s := range sides {
				dropped, err := projection.DropRetired(ctx, s.db.Pool, s.db.Schema, bgName, 0)
				if err != nil || !slices.Equal(dropped, []int{2}) {
					t.Fatalf("%s: DropRetired: %v %v, want [2]", s.db.Schema, dropped, err)
				}
				check(s.db.Schema + " dropped its retired generation")
				for j, o := range sides {
					for _, g := range o.generations(t) {
						gone := g.Generation == 2 && j <= i
						if schemaExists(t, db, g.Schema) == gone {
							t.Errorf("after %s dropped its generation 2: %s's generation %d (%s, %s): schema there: %v",
								s.db.Schema, o.db.Schema, g.Generation, g.Schema, g.State, !gone)
						}
					}
				}
			}
		})
	}
}

// TestBlueGreenUnscopedGenerationOfEarlierVersion: in an annals schema
// other than the default, a generation an earlier version made has the
// unscoped name (rm_bgstats_g1): it is run, cut over from, rolled back to
// and dropped like the generations made now (rm_bgstats_g<N>_<tag>). A row
// naming any other schema than those two names of its generation is
// still refused (ErrForgedGeneration) and the schema is not dropped.
func TestBlueGreenUnscopedGenerationOfEarlierVersion(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, &annalstest.Options{Schema: "tenant_b"})
	ctx := t.Context()
	s := newBGSide(t, db, "reads_b")
	schema := pgx.Identifier{db.Schema}.Sanitize()
	// Generation 1 as an earlier version made it (createGeneration): the
	// row, its schema, the setup in it, and the reader's views.
	for _, q := range []string{
		`INSERT INTO ` + schema + `.read_model_generations
		     (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by, live_since)
		 VALUES ('bgstats', 1, 1, 'rm_bgstats_g1', 'reads_b', 'bgstats#g1', 'live', 'earlier', clock_timestamp())`,
		`SELECT ` + schema + `.read_model_create_schema('bgstats', 1)`,
		`CREATE TABLE rm_bgstats_g1.stats (stream text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)`,
		`SELECT ` + schema + `.read_model_swap_views('reads_b', NULL, 'rm_bgstats_g1')`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := s.log.add(ctx, 6, 3); err != nil {
		t.Fatal(err)
	}
	bgRunInBackground(t, s.runner(t, "v1", 1))
	annalstest.WaitForErr(t, 30*time.Second, func() error { return s.sees(t, 1) })

	v2 := s.runner(t, "v2", 2)
	c, err := v2.RebuildBlueGreen(ctx, bgName, nil)
	if err != nil || c.From != 1 || c.To != 2 {
		t.Fatalf("cut-over from the unscoped g1 to g2: %+v %v", c, err)
	}
	annalstest.WaitForErr(t, 30*time.Second, func() error { return s.sees(t, 2) })
	if g := s.generations(t)[1]; g.Schema != scopedName(db.Schema, 2) {
		t.Errorf("generation 2's schema is %q, want %q", g.Schema, scopedName(db.Schema, 2))
	}
	rb, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName)
	if err != nil || rb.From != 2 || rb.To != 1 {
		t.Fatalf("rollback to the unscoped g1: %+v %v", rb, err)
	}
	annalstest.WaitForErr(t, 30*time.Second, func() error { return s.sees(t, 1) })
	if c, err = v2.RebuildBlueGreen(ctx, bgName, nil); err != nil || c.From != 1 || c.To != 3 {
		t.Fatalf("cut-over from the unscoped g1 to g3: %+v %v", c, err)
	}
	annalstest.WaitForErr(t, 30*time.Second, func() error { return s.sees(t, 2) })
	dropped, err := projection.DropRetired(ctx, db.Pool, db.Schema, bgName, 0)
	if err != nil || !slices.Equal(dropped, []int{1, 2}) {
		t.Fatalf("DropRetired: %v %v, want [1 2]", dropped, err)
	}
	for name, want := range map[string]bool{"rm_bgstats_g1": false, scopedName(db.Schema, 2): false, scopedName(db.Schema, 3): true} {
		if got := schemaExists(t, db, name); got != want {
			t.Errorf("schema %s there: %v, want %v", name, got, want)
		}
	}

	// Generation 4's row, retired, naming schemas annals never gives
	// generation 4 of bgstats in tenant_b: the name another annals schema
	// gives it, the unscoped and scoped names of other generations, and an
	// unrelated schema. Each is refused and left as it is.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+schema+`.read_model_generations
		     (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by, retired_at)
		 VALUES ('bgstats', 4, 2, 'victim', 'reads_b', 'bgstats#g4', 'retired', 'another runner', now() - interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	for _, victim := range []string{scopedName("annals", 4), scopedName("tenant_a", 4), "rm_bgstats_g5", scopedName(db.Schema, 5), "victim"} {
		if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{victim}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `UPDATE `+schema+`.read_model_generations SET schema_name = $1
			WHERE projection = 'bgstats' AND generation = 4`, victim); err != nil {
			t.Fatal(err)
		}
		dropped, err := projection.DropRetired(ctx, db.Pool, db.Schema, bgName, 0)
		if !errors.Is(err, projection.ErrForgedGeneration) || len(dropped) != 0 {
			t.Errorf("DropRetired of a row naming %s: %v %v, want ErrForgedGeneration", victim, dropped, err)
		}
		if !schemaExists(t, db, victim) {
			t.Errorf("schema %s was dropped", victim)
		}
	}
}
