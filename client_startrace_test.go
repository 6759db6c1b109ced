package annals_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	annals "github.com/annals-dev/annals"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

// TestClientsStartingAtOnceOnAFreshSchema: five replicas of a service
// (Clients on pools of their own) released together on a schema nobody
// migrated, each with a partitioned projection and a blue/green one (both
// with a setup), an inline projection with a setup, an observer, a saga and
// a cron task: every Start succeeds (the migrations, the setups, the
// generation, the layouts and the task each made once, the others waiting
// for them) and every Stop. Half of the replicas' sessions default to
// REPEATABLE READ, as a role's setting may make them.
func TestClientsStartingAtOnceOnAFreshSchema(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for round := range 4 {
		// A subtest per round: its database and pools go at its end.
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			db := annalstest.NewDB(t, nil)
			schema := fmt.Sprintf("fresh%d", round)
			const n = 5
			clients := make([]*annals.Client, n)
			for i := range n {
				pool := db.NewPool(t, func(cfg *pgxpool.Config) {
					cfg.MaxConns = 8
					if i%2 == 1 {
						cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
					}
				})
				if err := pool.Ping(ctx); err != nil {
					t.Fatal(err)
				}
				reg := eventstore.NewRegistry()
				eventstore.MustRegister[clDeposited](reg, "cl.deposited")
				eventstore.MustRegister[clOrderPlaced](reg, "cl.order_placed")
				eventstore.MustRegister[clDeadlinePassed](reg, "cl.deadline_passed")
				inl := projection.New("cl.inline", reg)
				inl.OnSetup(1, projection.Statements(fmt.Sprintf(`CREATE TABLE %s_inl (account text PRIMARY KEY)`, schema)))
				projection.On(inl, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[clOrderPlaced]) error { return nil })
				c, err := annals.New(pool, &annals.Config{Registry: reg, Schema: schema,
					Inline: []eventstore.InlineProjection{inl},
					Runner: &projection.Config{PollInterval: 50 * time.Millisecond}})
				if err != nil {
					t.Fatal(err)
				}
				clients[i] = c
				p := projection.New("cl.balances", reg)
				p.OnSetup(1, projection.Statements(fmt.Sprintf(`CREATE TABLE %s_bal (account text PRIMARY KEY, amount bigint NOT NULL)`, schema)))
				projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[clDeposited]) error { return nil })
				if err := annals.AddProjection(c, p, &projection.Options{Partitions: 4}); err != nil {
					t.Fatal(err)
				}
				bg := projection.New("cl.bg", reg)
				bg.OnSetup(1, projection.Statements(`CREATE TABLE bgt (account text PRIMARY KEY)`))
				projection.On(bg, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[clDeposited]) error { return nil })
				if err := annals.AddProjection(c, bg, &projection.Options{BlueGreen: &projection.BlueGreen{Version: 1, ReaderSchema: schema + "_r", CheckInterval: 100 * time.Millisecond}}); err != nil {
					t.Fatal(err)
				}
				o := projection.NewObserver("cl.notifier", reg)
				projection.Observe(o, func(_ context.Context, e eventstore.Envelope[clDeposited]) error { return nil })
				if err := annals.AddObserver(c, o, nil); err != nil {
					t.Fatal(err)
				}
				type st struct{ N int }
				s := saga.New[st]("cl.orders", reg)
				saga.On(s, func(e eventstore.Envelope[clOrderPlaced]) string { return e.Data.OrderID },
					func(ctx context.Context, inst *saga.Instance[st], e eventstore.Envelope[clOrderPlaced]) error {
						return nil
					})
				if err := annals.AddSaga(c, s, nil); err != nil {
					t.Fatal(err)
				}
				if err := annals.AddTask(c, scheduler.Task{Name: "cl.hourly", Spec: "@every 1h", StreamID: "cl-ticks"}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := db.Pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %s_r`, schema)); err != nil {
				t.Fatal(err)
			}
			start := make(chan struct{})
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					errs[i] = clients[i].Start(ctx)
				}()
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("round %d: client %d: %v", round, i, err)
				}
			}
			for i := range n {
				if errs[i] == nil {
					if err := clients[i].Stop(ctx); err != nil {
						t.Errorf("round %d: stop %d: %v", round, i, err)
					}
				}
			}
			if t.Failed() {
				return
			}
			var tasks, setups int
			if err := db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]s.cron_tasks), (SELECT count(*) FROM %[1]s.read_model_setups)`, schema)).Scan(&tasks, &setups); err != nil {
				t.Fatal(err)
			}
			if tasks != 1 || setups != 2 {
				t.Fatalf("round %d: %d tasks, %d setups recorded; want 1 and 2 (cl.balances, cl.inline)", round, tasks, setups)
			}
		})
	}
}
