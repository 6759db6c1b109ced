package annalstest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/migrations"
)

// PrivateCluster starts a PostgreSQL cluster of the test's own, with opts
// (nil: pgcluster's defaults), for a test that changes server settings,
// restarts or stops the server: the shared server of NewDB must not be.
// It migrates the annals schema and returns the cluster and a pool on it;
// the pool is closed and the cluster stopped when the test ends.
func PrivateCluster(t testing.TB, ctx context.Context, opts *pgcluster.Options) (*pgcluster.Cluster, *pgxpool.Pool) {
	t.Helper()
	cluster, err := pgcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cluster.Stop(sctx); err != nil {
			t.Error(err)
		}
	})
	pool, err := pgxpool.New(ctx, cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	return cluster, pool
}

// PgBouncer starts a PgBouncer in front of the server of url (see
// pgcluster.StartPgBouncer; opts nil: transaction mode, two server
// sessions) and stops it when the test ends. It returns the URL of url's
// database as url's user through the pooler, and the pooler.
func PgBouncer(t testing.TB, url string, opts *pgcluster.PgBouncerOptions) (string, *pgcluster.PgBouncer) {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pgcluster.StartPgBouncer(t.Context(), url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Error(err)
		}
	})
	return b.URL(cfg.Database, cfg.User), b
}
