package annalstest

import (
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// AtOnce stands in for n processes of a service starting together (a
// rollout's replicas): it opens n pools on the database (NewPool; config
// may change the i-th one's configuration, e.g. its MaxConns or its
// default_transaction_isolation), connects each, then runs fn(i, pool)
// for all of them released at one moment, and returns their errors, in
// order. The pools close when the test ends.
func (db *DB) AtOnce(t testing.TB, n int, config func(i int, cfg *pgxpool.Config), fn func(i int, pool *pgxpool.Pool) error) []error {
	t.Helper()
	pools := make([]*pgxpool.Pool, n)
	for i := range pools {
		pools[i] = db.NewPool(t, func(cfg *pgxpool.Config) {
			if config != nil {
				config(i, cfg)
			}
		})
		if err := pools[i].Ping(t.Context()); err != nil { // connected before the release
			t.Fatalf("annalstest: connect pool %d: %v", i, err)
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
			errs[i] = fn(i, pools[i])
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

// HalfRepeatableRead is an AtOnce config giving every other pool (odd i) a
// REPEATABLE READ default_transaction_isolation, as a role's setting may,
// and each pool at most maxConns connections (0: pgxpool's default).
func HalfRepeatableRead(maxConns int32) func(i int, cfg *pgxpool.Config) {
	return func(i int, cfg *pgxpool.Config) {
		if maxConns > 0 {
			cfg.MaxConns = maxConns
		}
		if i%2 == 1 {
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
		}
	}
}
