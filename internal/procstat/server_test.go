package procstat_test

import (
	"context"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/procstat"
)

// The test cluster of annalstest: an external test package, as annalstest
// starts clusters through pgcluster, which uses this package.
func TestMain(m *testing.M) { annalstest.Main(m) }

// FindServer finds a server that runs on this machine (the test clusters
// do), and its CPU time grows while it works.
func TestServerCPU(t *testing.T) {
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	srv, why := procstat.FindServer(ctx, db.Pool)
	if srv == nil {
		t.Fatalf("the test cluster's server was not found: %s", why)
	}
	before, err := srv.Total()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		// About 100 ms of server CPU time.
		if _, err := db.Pool.Exec(ctx, "SELECT count(*) FROM generate_series(1, 1000000)"); err != nil {
			t.Fatal(err)
		}
		after, err := srv.Total()
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server's CPU time did not grow: %v", after)
		}
	}
}
