package walsource_test

import (
	"context"
	"fmt"
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
			errs := db.AtOnce(t, n, annalstest.HalfRepeatableRead(1), func(i int, pool *pgxpool.Pool) error {
				_, err := walsource.NewWake(ctx, pool, nil)
				return err
			})
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
