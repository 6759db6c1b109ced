package projection_test

import (
	"context"
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

// waitSees waits until the side's readers see the whole log as version
// version wrote it.
func (s *bgSide) waitSees(t *testing.T, version int, step string) {
	t.Helper()
	annalstest.WaitForErr(t, 30*time.Second, func() error { return errors.Wrap(s.sees(t, version), step) })
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

// schemaOf returns the schema of the side's generation gen.
func (s *bgSide) schemaOf(t *testing.T, gen int) string {
	t.Helper()
	for _, g := range s.generations(t) {
		if g.Generation == gen {
			return g.Schema
		}
	}
	t.Fatalf("%s has no generation %d", s.db.Schema, gen)
	return ""
}

func schemaExists(t *testing.T, db *annalstest.DB, schema string) bool {
	t.Helper()
	var ok bool
	if err := db.Pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// unscopedName is the schema annals gives generation gen of bgName when
// it is free: rm_bgstats_g<gen>, as it always has.
func unscopedName(gen int) string { return fmt.Sprintf("rm_%s_g%d", bgName, gen) }

// scopedName is the schema annals gives generation gen of bgName in annals
// schema schema when the unscoped name is taken: rm_bgstats_g<gen>_<8 hex
// of md5(schema)>.
func scopedName(schema string, gen int) string {
	h := md5.Sum([]byte(schema))
	return fmt.Sprintf("rm_%s_g%d_%s", bgName, gen, hex.EncodeToString(h[:4]))
}

// TestBlueGreenTwoAnnalsSchemas: two annals schemas of one database (a
// service or a tenant per schema) each run a blue/green projection of the
// same name, each with its own reader schema. Annals named a generation's
// schema after the projection alone (rm_<name>_g<N>), so the second
// schema's first generation failed with 42P06 (schema rm_bgstats_g1
// already exists). The first to create a generation still gets
// rm_bgstats_g<N>, the other rm_bgstats_g<N>_<tag>; each builds, cuts
// over, rolls back and drops its own generations, and the other's readers
// and schemas are untouched at every step.
func TestBlueGreenTwoAnnalsSchemas(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ a, b string }{
		{"annals", "tenant_b"},
		{"tenant_a", `Tenant "B"`},
	} {
		t.Run(c.a+"+"+c.b, func(t *testing.T) {
			db := annalstest.NewDB(t, &annalstest.Options{Schema: c.a})
			ctx := t.Context()
			first, second := newBGSide(t, db, "reads_a"), newBGSide(t, secondSchema(t, db, c.b), "reads_b")
			sides := []*bgSide{first, second}
			want := map[*bgSide]int{} // the version each side's readers see
			check := func(step string) {
				t.Helper()
				for _, s := range sides {
					if want[s] != 0 {
						s.waitSees(t, want[s], step)
					}
				}
			}
			// wantName is the schema of generation gen of side s: first
			// creates each generation number before second.
			wantName := func(s *bgSide, gen int) string {
				if s == first {
					return unscopedName(gen)
				}
				return scopedName(s.db.Schema, gen)
			}
			for i, s := range sides {
				if err := s.log.add(ctx, 5+i, 4); err != nil {
					t.Fatal(err)
				}
				bgRunInBackground(t, s.runner(t, s.db.Schema+"-v1", 1))
				want[s] = 1
				check(s.db.Schema + " first generation")
			}
			for _, s := range sides {
				if got := s.schemaOf(t, 1); got != wantName(s, 1) {
					t.Errorf("%s: generation 1's schema is %q, want %q", s.db.Schema, got, wantName(s, 1))
				}
			}
			for _, s := range sides {
				c, err := s.runner(t, s.db.Schema+"-v2", 2).RebuildBlueGreen(ctx, bgName, nil)
				if err != nil || c.From != 1 || c.To != 2 {
					t.Fatalf("%s: cut-over to g2: %+v %v", s.db.Schema, c, err)
				}
				if got := s.schemaOf(t, 2); got != wantName(s, 2) {
					t.Errorf("%s: generation 2's schema is %q, want %q", s.db.Schema, got, wantName(s, 2))
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
					for gen := 1; gen <= 2; gen++ {
						gone := gen == 2 && j <= i
						if schemaExists(t, db, wantName(o, gen)) == gone {
							t.Errorf("after %s dropped its generation 2: %s's generation %d (%s): schema there: %v",
								s.db.Schema, o.db.Schema, gen, wantName(o, gen), !gone)
						}
					}
				}
			}
		})
	}
}

// TestBlueGreenLeftoverOfAnotherAnnalsSchema: an annals schema that ran a
// blue/green projection and was dropped leaves its generation schema
// (rm_bgstats_g1) behind. It blocked the default schema's first generation
// of a projection of the same name (42P06), which now takes the scoped name
// and runs; its next generation, whose unscoped name is free, takes that.
// Rollback to the scoped generation and the drop of the unscoped one work
// alike, and the leftover is never touched.
func TestBlueGreenLeftoverOfAnotherAnnalsSchema(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	gone := newBGSide(t, secondSchema(t, db, "tenant_gone"), "reads_gone")
	if err := gone.log.add(ctx, 3, 2); err != nil {
		t.Fatal(err)
	}
	stop := bgRunInBackground(t, gone.runner(t, "gone", 1))
	gone.waitSees(t, 1, "the other annals schema's generation")
	stop()
	if got := gone.schemaOf(t, 1); got != unscopedName(1) {
		t.Fatalf("the other annals schema's generation 1 is %q, want %q", got, unscopedName(1))
	}
	if _, err := db.Pool.Exec(ctx, `DROP SCHEMA tenant_gone CASCADE`); err != nil {
		t.Fatal(err)
	}

	s := newBGSide(t, db, "reads")
	if err := s.log.add(ctx, 4, 3); err != nil {
		t.Fatal(err)
	}
	bgRunInBackground(t, s.runner(t, "v1", 1))
	s.waitSees(t, 1, "first generation beside a leftover")
	if got := s.schemaOf(t, 1); got != scopedName("annals", 1) {
		t.Errorf("generation 1's schema is %q, want %q", got, scopedName("annals", 1))
	}
	c, err := s.runner(t, "v2", 2).RebuildBlueGreen(ctx, bgName, nil)
	if err != nil || c.From != 1 || c.To != 2 {
		t.Fatalf("cut-over to g2: %+v %v", c, err)
	}
	s.waitSees(t, 2, "cut over")
	if got := s.schemaOf(t, 2); got != unscopedName(2) {
		t.Errorf("generation 2's schema is %q, want %q", got, unscopedName(2))
	}
	if rb, err := projection.Rollback(ctx, db.Pool, db.Schema, bgName); err != nil || rb.From != 2 || rb.To != 1 {
		t.Fatalf("rollback to g1: %+v %v", rb, err)
	}
	s.waitSees(t, 1, "rolled back")
	if dropped, err := projection.DropRetired(ctx, db.Pool, db.Schema, bgName, 0); err != nil || !slices.Equal(dropped, []int{2}) {
		t.Fatalf("DropRetired: %v %v, want [2]", dropped, err)
	}
	for name, want := range map[string]bool{unscopedName(1): true, scopedName("annals", 1): true, unscopedName(2): false} {
		if got := schemaExists(t, db, name); got != want {
			t.Errorf("schema %s there: %v, want %v", name, got, want)
		}
	}
	// The leftover is the other schema's still: its table and the views
	// of its reader schema.
	if _, err := readStats(ctx, db.Pool, "reads_gone.stats"); err != nil {
		t.Errorf("the leftover generation's views: %v", err)
	}
}

// TestBlueGreenGenerationCreatedAtOnce: two annals schemas create
// generation 2 of a projection of the same name at the same moment, each
// under its own generations lock. The one whose CREATE SCHEMA
// rm_bgstats_g2 waits for the other's (uncommitted) one fails when that
// commits (23505 on pg_namespace): it takes the scoped name instead, in
// the same transaction, and its rebuild goes through.
func TestBlueGreenGenerationCreatedAtOnce(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	a, b := newBGSide(t, db, "reads_a"), newBGSide(t, secondSchema(t, db, "tenant_b"), "reads_b")
	for i, s := range []*bgSide{a, b} {
		if err := s.log.add(ctx, 3+i, 3); err != nil {
			t.Fatal(err)
		}
		bgRunInBackground(t, s.runner(t, s.db.Schema+"-v1", 1))
		s.waitSees(t, 1, "first generation")
	}

	// a's generation 2 as its createGeneration makes it, held open
	// after its CREATE SCHEMA.
	racer, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = racer.Rollback(context.WithoutCancel(ctx)) }()
	for _, q := range []string{
		`INSERT INTO annals.read_model_generations (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by)
		 VALUES ('bgstats', 2, 2, 'rm_bgstats_g2', 'reads_a', 'bgstats#g2', 'building', 'racer')`,
		`SELECT annals.read_model_create_schema('bgstats', 2)`,
		`CREATE TABLE rm_bgstats_g2.stats (stream text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)`,
	} {
		if _, err := racer.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	type result struct {
		c   projection.Cutover
		err error
	}
	done := make(chan result, 1)
	v2 := b.runner(t, "tenant_b-v2", 2)
	go func() {
		c, err := v2.RebuildBlueGreen(ctx, bgName, nil)
		done <- result{c, err}
	}()
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%read_model_create_schema%'`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return errors.New("tenant_b's CREATE SCHEMA does not wait for annals' yet")
		}
		return nil
	})
	if err := racer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("tenant_b's rebuild did not end")
	}
	if r.err != nil || r.c.From != 1 || r.c.To != 2 {
		t.Fatalf("tenant_b's cut-over to g2 beside annals' g2: %+v %v", r.c, r.err)
	}
	b.waitSees(t, 2, "tenant_b cut over")
	a.waitSees(t, 1, "annals untouched")
	if got := b.schemaOf(t, 2); got != scopedName("tenant_b", 2) {
		t.Errorf("tenant_b's generation 2 is %q, want %q", got, scopedName("tenant_b", 2))
	}
	if got := a.schemaOf(t, 2); got != unscopedName(2) {
		t.Errorf("annals' generation 2 is %q, want %q", got, unscopedName(2))
	}
}

// TestBlueGreenForgedNamesOfOtherSchemas: the forged-row check accepts the
// two names annals could have given a generation in its annals schema and
// no other: a retired row naming the name another annals schema's
// generation of that number has (its scoped name), another generation's
// names, or any other schema, is refused by DropRetired
// (ErrForgedGeneration) and the schema is left as it is.
func TestBlueGreenForgedNamesOfOtherSchemas(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, &annalstest.Options{Schema: "tenant_b"})
	ctx := t.Context()
	schema := pgx.Identifier{db.Schema}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+schema+`.read_model_generations
		     (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by, retired_at)
		 VALUES ('bgstats', 4, 2, 'victim', 'reads_b', 'bgstats#g4', 'retired', 'another runner', now() - interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	for _, victim := range []string{scopedName("annals", 4), scopedName("tenant_a", 4), unscopedName(5), scopedName(db.Schema, 5),
		unscopedName(4) + "_x", scopedName(db.Schema, 4) + "x", "victim"} {
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
