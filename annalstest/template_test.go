package annalstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"testing"
)

// freshSchema returns a schema name no template exists for, and drops its
// template when the test ends so that a shared server does not collect them.
func freshSchema(t *testing.T) (schema, template string) {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema = "fresh_" + hex.EncodeToString(b[:])
	template, err := templateName(schema)
	if err != nil {
		t.Fatal(err)
	}
	admin := adminPool(t)
	t.Cleanup(func() {
		for _, name := range []string{template, buildName(template)} {
			if _, err := admin.Exec(context.Background(), bind("DropDatabase", name, "")); err != nil {
				t.Errorf("drop %s: %v", name, err)
			}
		}
	})
	return schema, template
}

func TestTemplateBuiltOnceUnderConcurrency(t *testing.T) {
	t.Parallel()
	srv, err := getServer()
	if err != nil {
		t.Fatal(err)
	}
	schema, name := freshSchema(t)
	const n = 8
	var builds atomic.Int32
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			built, err := ensureTemplate(t.Context(), srv.adminURL, schema, name)
			if err != nil {
				t.Errorf("ensureTemplate: %v", err)
			}
			if built {
				builds.Add(1)
			}
		})
	}
	wg.Wait()
	if got := builds.Load(); got != 1 {
		t.Fatalf("the template was built %d times by %d concurrent callers, want once", got, n)
	}
	var allowConn bool
	if err := srv.admin.QueryRow(t.Context(), "SELECT datallowconn FROM pg_database WHERE datname = $1", name).Scan(&allowConn); err != nil {
		t.Fatalf("template %s: %v", name, err)
	}
	if allowConn {
		t.Errorf("template %s accepts connections", name)
	}
	if databaseExists(t, buildName(name)) {
		t.Errorf("build database %s is left over", buildName(name))
	}
	// Through NewDB too, from parallel goroutines of this process.
	t.Run("NewDB", func(t *testing.T) {
		for range 3 {
			t.Run("Clone", func(t *testing.T) {
				t.Parallel()
				db := NewDB(t, &Options{Schema: schema})
				if seq := appendOne(t, db, "s"); seq != 1 {
					t.Errorf("global_sequence = %d, want 1", seq)
				}
			})
		}
	})
}

func TestTemplateDropsLeftoverBuild(t *testing.T) {
	t.Parallel()
	srv, err := getServer()
	if err != nil {
		t.Fatal(err)
	}
	schema, name := freshSchema(t)
	// A build that crashed half-way: the database exists under the build name.
	if _, err := srv.admin.Exec(t.Context(), bind("CreateEmptyDatabase", buildName(name), "")); err != nil {
		t.Fatal(err)
	}
	built, err := ensureTemplate(t.Context(), srv.adminURL, schema, name)
	if err != nil || !built {
		t.Fatalf("ensureTemplate over a leftover build = %v, %v; want built", built, err)
	}
	if !databaseExists(t, name) || databaseExists(t, buildName(name)) {
		t.Fatalf("after the build: template exists = %v, leftover exists = %v",
			databaseExists(t, name), databaseExists(t, buildName(name)))
	}
	if built, err := ensureTemplate(t.Context(), srv.adminURL, schema, name); err != nil || built {
		t.Fatalf("second ensureTemplate = %v, %v; want an existing template", built, err)
	}
}

func TestTemplateName(t *testing.T) {
	t.Parallel()
	a1, err1 := templateName("annals")
	a2, err2 := templateName("annals")
	b, err3 := templateName(`My "Schema"`)
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatal(err1, err2, err3)
	}
	if a1 != a2 || a1 == b {
		t.Errorf("templateName: annals -> %s and %s, My \"Schema\" -> %s", a1, a2, b)
	}
	if len(buildName(a1)) > 63 {
		t.Errorf("build name %s is longer than PostgreSQL's 63-byte identifiers", buildName(a1))
	}
}
