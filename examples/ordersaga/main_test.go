package main

import (
	"context"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

func TestMain(m *testing.M) { annalstest.Main(m) }

// The example runs against a fresh database and every order ends as its
// scenario says (run checks the outcomes), within its one-minute budget.
func TestOrderSagaRuns(t *testing.T) {
	db := annalstest.NewDB(t, nil)
	t.Setenv("DATABASE_URL", db.URL)
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
}
