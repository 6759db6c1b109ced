package annals_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// TestClientRunnerPool: a service whose appends go through PgBouncer in
// transaction mode (pgx's CacheDescribe, for a pooler without prepared
// statements) runs its runner, scheduler and Await on Config.RunnerPool, a
// direct pool: the projection follows by notification (its poll is a
// minute) and each Await returns without waiting out a poll. (Without
// RunnerPool the runner's lock session is refused by the pooler, and it
// leads nothing.)
func TestClientRunnerPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	pooled, _ := annalstest.PgBouncer(t, db.URL, nil)
	cfg, err := pgxpool.ParseConfig(pooled)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	app, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Close)

	client := func(runnerPool *pgxpool.Pool) *annals.Client {
		t.Helper()
		reg := eventstore.NewRegistry()
		eventstore.MustRegister[clDeposited](reg, "cl.deposited")
		c, err := annals.New(app, &annals.Config{Registry: reg, RunnerPool: runnerPool,
			Runner: &projection.Config{PollInterval: time.Minute, LockRetryInterval: 200 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		p := projection.New("rp.async", reg)
		p.OnSetup(1, projection.Statements(`CREATE TABLE rp_async (account text PRIMARY KEY, amount bigint NOT NULL)`))
		projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[clDeposited]) error {
			_, err := tx.Exec(ctx, `INSERT INTO rp_async VALUES ($1, $2)
				ON CONFLICT (account) DO UPDATE SET amount = rp_async.amount + $2`, e.StreamID, e.Data.Amount)
			return err
		})
		if err := annals.AddProjection(c, p, nil); err != nil {
			t.Fatal(err)
		}
		return c
	}

	c := client(db.Pool)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	start := time.Now()
	for i := range 10 {
		res, err := c.Append(ctx, "acct-rp", eventstore.Exact(int64(i)), eventstore.NewEvent(clDeposited{Amount: 1}))
		if err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err = c.Await(actx, "rp.async", res.Position())
		cancel()
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	// Through the pooler, each Await would wait out its 1 s poll (LISTEN
	// does not work through transaction pooling).
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("10 appends and Awaits took %s: the notifications did not arrive", d)
	}
	var n int64
	if err := db.Pool.QueryRow(ctx, `SELECT amount FROM rp_async WHERE account = 'acct-rp'`).Scan(&n); err != nil || n != 10 {
		t.Fatalf("read model: %d, %v; want 10", n, err)
	}
}
