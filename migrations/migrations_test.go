package migrations_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/migrations"
)

func TestUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// setup returns a fresh database and a schema nobody has migrated yet.
	setup := func(t *testing.T, schema string) (*annalstest.DB, *migrations.Config) {
		return annalstest.NewDB(t, nil), &migrations.Config{Schema: schema}
	}
	all, err := migrations.All(nil)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("FreshThenNoOp", func(t *testing.T) {
		t.Parallel()
		db, cfg := setup(t, "fresh")
		states, err := migrations.Status(ctx, db.Pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range states {
			if s.Applied {
				t.Fatalf("migration %d applied before Up", s.Version)
			}
		}
		applied, err := migrations.Up(ctx, db.Pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if len(applied) != len(all) {
			t.Fatalf("applied %d migrations, want %d", len(applied), len(all))
		}
		again, err := migrations.Up(ctx, db.Pool, cfg)
		if err != nil || len(again) != 0 {
			t.Fatalf("second Up applied %d (%v), want a no-op", len(again), err)
		}
		states, err = migrations.Status(ctx, db.Pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range states {
			if !s.Applied || s.AppliedAt.IsZero() {
				t.Fatalf("migration %d not reported applied: %+v", s.Version, s)
			}
		}
		if _, err := db.Pool.Exec(ctx, `SELECT * FROM fresh.append_events('s', 0, '[{"type":"t","data":{}}]')`); err != nil {
			t.Fatalf("the migrated schema does not work: %v", err)
		}
	})

	t.Run("ConcurrentUp", func(t *testing.T) {
		t.Parallel()
		db, cfg := setup(t, "raced")
		const n = 6
		var wg sync.WaitGroup
		applied := make([]int, n)
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ms, err := migrations.Up(ctx, db.Pool, cfg)
				applied[i], errs[i] = len(ms), err
			}()
		}
		close(start)
		wg.Wait()
		total := 0
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("Up %d: %v", i, errs[i])
			}
			total += applied[i]
		}
		if total != len(all) {
			t.Fatalf("%d concurrent Up calls applied %d migrations in all, want each applied once (%d)", n, total, len(all))
		}
		var rows int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM raced.schema_migrations`).Scan(&rows); err != nil || rows != len(all) {
			t.Fatalf("schema_migrations has %d rows (%v)", rows, err)
		}
	})

	t.Run("SchemaNameNeedingQuotes", func(t *testing.T) {
		t.Parallel()
		const schema = `Ünïcode "Quoted"; DROP TABLE x; --`
		db, cfg := setup(t, schema)
		if _, err := migrations.Up(ctx, db.Pool, cfg); err != nil {
			t.Fatal(err)
		}
		if _, err := migrations.Up(ctx, db.Pool, cfg); err != nil {
			t.Fatal(err)
		}
		var pos int64
		err := db.Pool.QueryRow(ctx, `SELECT global_sequence FROM `+schemaname.Ident(schema)+`.append_events('s', 0, '[{"type":"t","data":{}}]')`).Scan(&pos)
		if err != nil || pos != 1 {
			t.Fatalf("append in quoted schema: %d, %v", pos, err)
		}
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&n); err != nil || n != 1 {
			t.Fatalf("schema %q not created exactly as named (%d, %v)", schema, n, err)
		}
	})

	t.Run("TwoSchemasInOneDatabase", func(t *testing.T) {
		t.Parallel()
		db, _ := setup(t, "")
		for _, s := range []string{"tenant_a", "tenant_b"} {
			if _, err := migrations.Up(ctx, db.Pool, &migrations.Config{Schema: s}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.Pool.Exec(ctx, `SELECT * FROM tenant_a.append_events('s', 0, '[{"type":"t","data":{}}]')`); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM tenant_b.events`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("schemas not isolated: %d, %v", n, err)
		}
	})

	t.Run("InvalidSchemaName", func(t *testing.T) {
		t.Parallel()
		db, _ := setup(t, "")
		for _, bad := range []string{"has$dollar", strings.Repeat("x", 100)} {
			if _, err := migrations.Up(ctx, db.Pool, &migrations.Config{Schema: bad}); !errors.Is(err, schemaname.ErrInvalid) {
				t.Errorf("Up(%q) err = %v, want ErrInvalid", bad, err)
			}
			if _, err := migrations.Script(&migrations.Config{Schema: bad}); !errors.Is(err, schemaname.ErrInvalid) {
				t.Errorf("Script(%q) err = %v, want ErrInvalid", bad, err)
			}
		}
	})

	t.Run("ScriptMatchesMigrations", func(t *testing.T) {
		t.Parallel()
		script, err := migrations.Script(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range all {
			// The script pins the search_path once, for its session.
			body := strings.TrimPrefix(m.SQL, "SET LOCAL search_path = pg_catalog, pg_temp;\n")
			if !strings.Contains(script, strings.TrimSpace(body)) {
				t.Errorf("script lacks migration %d", m.Version)
			}
		}
		if !strings.HasPrefix(all[0].Name, "events") || all[0].Version != 1 {
			t.Errorf("first migration is %d_%s", all[0].Version, all[0].Name)
		}
	})
}
