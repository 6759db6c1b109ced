package main

import (
	"context"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

func TestMain(m *testing.M) { annalstest.Main(m) }

// The demo (make demo) runs against a fresh database without error.
func TestQuickstartRuns(t *testing.T) {
	db := annalstest.NewDB(t, &annalstest.Options{Schema: "annals"})
	t.Setenv("DATABASE_URL", db.URL)
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
}
