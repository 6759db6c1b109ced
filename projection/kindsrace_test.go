package projection_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// TestRunnersStartingAtOnceUnderRepeatableReadDefault: runners of one
// service (a projection and four observers each) released together on a
// fresh database whose sessions default to REPEATABLE READ all start. The
// start records each subscriber's kind (kinds.go, RecordKind: one UPDATE
// at the session's level): the losers of the concurrent update failed to
// serialize (40001) and their Start failed, where READ COMMITTED finds the
// row changed and reads the kind again.
func TestRunnersStartingAtOnceUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[setupDeposited](reg, "su.deposited")
	for round := range 10 {
		// A subtest per round: its database and pools go at its end.
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			db := annalstest.NewDB(t, nil)
			const n = 6
			runners := make([]*projection.Runner, n)
			for i := range runners {
				cfg, err := pgxpool.ParseConfig(db.URL)
				if err != nil {
					t.Fatal(err)
				}
				cfg.MaxConns = 6
				cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer pool.Close()
				if err := pool.Ping(ctx); err != nil {
					t.Fatal(err)
				}
				r, err := projection.NewRunner(pool, &projection.Config{InstanceID: fmt.Sprintf("start-%d-%d", round, i),
					PollInterval: 50 * time.Millisecond, ShutdownTimeout: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				p := projection.New("sr.balances", reg)
				projection.On(p, func(context.Context, pgx.Tx, eventstore.Envelope[setupDeposited]) error { return nil })
				if err := r.Register(p, &projection.Options{Partitions: 2}); err != nil {
					t.Fatal(err)
				}
				for _, name := range []string{"sr.notify", "sr.audit", "sr.mail", "sr.search"} {
					o := projection.NewObserver(name, reg)
					projection.Observe(o, func(context.Context, eventstore.Envelope[setupDeposited]) error { return nil })
					if err := r.Register(o, nil); err != nil {
						t.Fatal(err)
					}
				}
				runners[i] = r
			}
			start := make(chan struct{})
			errs := make([]error, n)
			dones := make([]<-chan struct{}, n)
			rctx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					dones[i], errs[i] = runners[i].Start(rctx)
				}()
			}
			close(start)
			wg.Wait()
			stop()
			for i := range n {
				if errs[i] == nil {
					<-dones[i]
				}
			}
			for i, err := range errs {
				if err != nil {
					t.Fatalf("round %d: runner %d: %v", round, i, err)
				}
			}
			// Every subscriber's kind is recorded, whoever recorded it.
			rows, err := db.Pool.Query(ctx, `SELECT subscriber_id, coalesce(kind, '') FROM `+
				pgx.Identifier{db.Schema, "subscriber_layouts"}.Sanitize()+` ORDER BY subscriber_id`)
			if err != nil {
				t.Fatal(err)
			}
			kinds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
				var sub, kind string
				err := r.Scan(&sub, &kind)
				return sub + "=" + kind, err
			})
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"sr.audit=observer", "sr.balances=projection", "sr.mail=observer", "sr.notify=observer", "sr.search=observer"}
			if !slices.Equal(kinds, want) {
				t.Fatalf("round %d: recorded kinds %v, want %v", round, kinds, want)
			}
		})
	}
}
