package scheduler

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// TestAddTaskFromReplicasStartingAtOnce: six processes (pools of their
// own, half with a REPEATABLE READ default) released together on a fresh
// database add the same four tasks, as replicas do at start: all succeed
// and each task is stored once. Before, the upserts at REPEATABLE READ
// that met a row another process inserted after their snapshot failed to
// serialize (40001).
func TestAddTaskFromReplicasStartingAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for round := range 10 {
		// A subtest per round: its database and pools go at its end.
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			db := annalstest.NewDB(t, nil)
			const n = 6
			scheds := make([]*Scheduler, n)
			for i := range n {
				pcfg, err := pgxpool.ParseConfig(db.URL)
				if err != nil {
					t.Fatal(err)
				}
				pcfg.MaxConns = 2
				if i%2 == 1 {
					pcfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
				}
				pool, err := pgxpool.NewWithConfig(ctx, pcfg)
				if err != nil {
					t.Fatal(err)
				}
				defer pool.Close()
				if err := pool.Ping(ctx); err != nil { // connected before the release
					t.Fatal(err)
				}
				store, err := eventstore.New(pool, &eventstore.Config{Schema: db.Schema})
				if err != nil {
					t.Fatal(err)
				}
				scheds[i], err = New(store, nil)
				if err != nil {
					t.Fatal(err)
				}
			}
			start := make(chan struct{})
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for _, name := range []string{"a", "b", "c", "d"} {
						if err := scheds[i].AddTask(ctx, Task{Name: name, Spec: "@every 1h", StreamID: "ticks"}); err != nil {
							errs[i] = err
							return
						}
					}
				}()
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("round %d: process %d: %v", round, i, err)
				}
			}
			var tasks int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.cron_tasks`).Scan(&tasks); err != nil {
				t.Fatal(err)
			}
			if tasks != 4 {
				t.Fatalf("round %d: %d tasks stored, want 4", round, tasks)
			}
		})
	}
}
