package walsource_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/walsource"
)

// TestWakesStartingAtOnceOnAFreshDatabase: replicas starting together
// (NewWake from pools of their own, half of them with a REPEATABLE READ
// default, released at one moment) on a database whose publication does
// not exist yet all start, and the publication is there; the loser of the
// concurrent CREATE PUBLICATION got a unique violation on the catalogs
// (23505) before.
func TestWakesStartingAtOnceOnAFreshDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for round := range 5 {
		// A subtest per round: its database and pools go at its end.
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			db := annalstest.NewDB(t, nil)
			const n = 6
			pools := make([]*pgxpool.Pool, n)
			for i := range pools {
				cfg, err := pgxpool.ParseConfig(db.URL)
				if err != nil {
					t.Fatal(err)
				}
				cfg.MaxConns = 1
				if i%2 == 1 {
					cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
				}
				p, err := pgxpool.NewWithConfig(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				if err := p.Ping(ctx); err != nil { // connected before the release
					t.Fatal(err)
				}
				pools[i] = p
			}
			start := make(chan struct{})
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, errs[i] = walsource.NewWake(ctx, pools[i], nil)
				}()
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("round %d: replica %d: %v", round, i, err)
				}
			}
			var pubs int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_publication WHERE pubname = $1`, walsource.PublicationName("")).Scan(&pubs); err != nil {
				t.Fatal(err)
			}
			if pubs != 1 {
				t.Fatalf("round %d: %d publications %s, want 1", round, pubs, walsource.PublicationName(""))
			}
		})
	}
}
