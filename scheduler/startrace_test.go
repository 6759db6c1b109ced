package scheduler

import (
	"context"
	"fmt"
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
			// The Store and Scheduler read nothing from the database when made.
			errs := db.AtOnce(t, n, annalstest.HalfRepeatableRead(2), func(_ int, pool *pgxpool.Pool) error {
				store, err := eventstore.New(pool, &eventstore.Config{Schema: db.Schema})
				if err != nil {
					return err
				}
				sched, err := New(store, nil)
				if err != nil {
					return err
				}
				for _, name := range []string{"a", "b", "c", "d"} {
					if err := sched.AddTask(ctx, Task{Name: name, Spec: "@every 1h", StreamID: "ticks"}); err != nil {
						return err
					}
				}
				return nil
			})
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
